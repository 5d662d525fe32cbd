"""The REST job notice (Slurm >= 23.02) against the fake slurmrestd, and the job-list filter.

1. Decision confirmed -> every job on the node signalled through slurmrestd
   (``GET /slurm/<v>/jobs/``, the node's jobs picked from the list, one durable
   row and one ``DELETE /slurm/<v>/job/{id}?signal=USR1`` per job), ``JOBS``
   jobs on the node among ``OTHERS`` elsewhere. Reference, in the same run: the
   same ``DELETE`` requests sent bare, one after the other. Loopback and a
   fake: the adapter's and the store's overhead, not Slurm's.
2. Picking one node's running jobs out of a list of ``LIST`` jobs (hostlists
   like ``gpu[0001-0064]``): the cost of each notice step on a big cluster.
   Reference: ``orjson.loads`` of that list, which every step pays anyway.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import aiohttp
import orjson

from adapters.schedulers.jobs import JobControl
from adapters.schedulers.slurm.auth import JwtToken
from adapters.schedulers.slurm.client import SlurmClient
from adapters.schedulers.slurm.job_list import convert, running_on
from adapters.schedulers.slurm.jobs import SlurmJobs
from adapters.schedulers.slurm.rest_jobs import SlurmRestJobs
from adapters.schedulers.slurm.sink import SlurmSink
from bench.delivery_latency import latency_rows
from bench.report import Row
from daemon.delivery.notices import JobNotices, NoticeSettings
from daemon.delivery.outbox import DecisionStore, Status
from fakes.slurmrestd import FakeSlurmrestd
from policies.model import REASON_PREFIX, Action, Decision, FaultDomain, idempotency_key

JOBS = 8
OTHERS = 200
LIST = 20_000
SAMPLES = 40


def _decision(action: Action, epoch: int) -> Decision:
    reason = f"{REASON_PREFIX} bench {action} #{epoch}"
    return Decision(
        "gpu0001",
        action,
        reason,
        FaultDomain.GPU,
        float(epoch),
        idempotency_key("gpu0001", action, epoch),
    )


async def _notice_latencies(jobs: JobControl, fake: FakeSlurmrestd, db: Path) -> list[float]:
    store = DecisionStore(db)
    notices = JobNotices(store, jobs, NoticeSettings(checkpoint_grace_s=3600.0))
    tasks = [asyncio.create_task(notices.run()), asyncio.create_task(store.run())]
    changed = asyncio.Event()
    notices.on_change = lambda n: changed.set()  # after every durable step

    async def until(condition: Callable[[], bool]) -> None:
        while not condition():
            changed.clear()
            await changed.wait()

    out = []
    try:
        await notices.loaded.wait()
        mine = [j for j in fake.jobs.values() if j.nodes == ["gpu0001"]]

        def told(times: int) -> bool:
            return all(len(j.signals) >= times for j in mine)

        before = len(mine[0].signals)  # a warm-up run's signals
        for i in range(SAMPLES):
            t0 = time.perf_counter()
            notices.settled(_decision(Action.DRAIN, 2 * i + 1), Status.CONFIRMED, "bench")
            await until(partial(told, before + i + 1))
            out.append((time.perf_counter() - t0) * 1000)
            notices.settled(_decision(Action.RESUME, 2 * i + 2), Status.CONFIRMED, "bench")
            await until(lambda: notices.current("gpu0001") is None)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        store.close()
    return out


async def _rest(work: Path) -> list[Row]:
    fake = FakeSlurmrestd([f"gpu{i:04d}" for i in range(1, 65)])
    await fake.start()
    ids = [fake.add_job("gpu0001") for _ in range(JOBS)]
    for i in range(OTHERS):
        fake.add_job(f"gpu{2 + i % 63:04d}", f"gpu{2 + (i + 1) % 63:04d}")
    token = work / "jwt"
    token.write_text("token-root")
    token.chmod(0o600)
    sink = SlurmSink(SlurmClient(fake.url, token=JwtToken(token)))
    jobs = SlurmRestJobs(sink.client, SlurmJobs(sink.client))
    headers = {"X-SLURM-USER-NAME": "root", "X-SLURM-USER-TOKEN": "token-root"}
    try:
        await _notice_latencies(jobs, fake, work / "warm.db")  # warm up
        lat = await _notice_latencies(jobs, fake, work / "bench.db")
        ref = []
        async with aiohttp.ClientSession(headers=headers) as http:
            for _ in range(SAMPLES):
                t0 = time.perf_counter()
                for job_id in ids:
                    url = f"{fake.url}/slurm/v0.0.42/job/{job_id}?signal=USR1&flags=FULL_JOB"
                    async with http.delete(url) as resp:
                        await resp.read()
                ref.append((time.perf_counter() - t0) * 1000)
    finally:
        await sink.close()
        await fake.stop()
    return latency_rows(
        f"REST notice: {JOBS} jobs signalled (fake)", lat, f"{JOBS} bare DELETE job", ref
    )


def _filter_rows() -> list[Row]:
    listing = {
        "jobs": [
            {
                "job_id": i + 1,
                "name": "train",
                "user_name": "alice",
                "job_state": ["RUNNING" if i % 3 else "PENDING"],
                "nodes": f"gpu[{1 + (i * 64) % 4096:04d}-{64 + (i * 64) % 4096:04d}]",
            }
            for i in range(LIST)
        ]
    }
    raw = orjson.dumps(listing)
    parse, pick = [], []
    for _ in range(5):
        t0 = time.perf_counter()
        body = orjson.loads(raw)
        t1 = time.perf_counter()
        running_on(convert(body), "gpu2049")
        t2 = time.perf_counter()
        parse.append((t1 - t0) * 1000)
        pick.append((t2 - t1) * 1000)
    return [
        Row(
            f"pick one node's jobs from {LIST} jobs",
            min(pick),
            "ms",
            "orjson.loads of the list",
            min(parse),
        )
    ]


def measure() -> list[Row]:
    """The REST notice latency and the list filter, each with its reference."""
    with tempfile.TemporaryDirectory(prefix="rg-bench-") as work:
        rows = asyncio.run(_rest(Path(work)))
    return rows + _filter_rows()
