"""Decision -> every job on the node signalled: p50 / p99 on a real Slurm 22.05.

One node with ``JOBS`` batch jobs running (each traps USR1 and appends the
time it got it to its marker file). A sample submits a drain to the decision
store and ends when the last job's trap ran: the store, the deliverer's read,
``scontrol update`` and read-back, then the notice (squeue, one durable row
and one ``scancel --signal=USR1 --full`` per job). A resume between samples
closes the notice. The reference, in the same run: one bare
``scancel --signal=USR1 --full`` of the same jobs, until the last trap ran.
Needs root (munged, slurmctld, slurmd).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from adapters.schedulers.slurm.client import SlurmClient
from adapters.schedulers.slurm.jobs import SlurmJobs
from adapters.schedulers.slurm.sink import SlurmSink
from bench.delivery_latency import latency_rows, start_slurm, stop_slurm
from bench.report import Row
from daemon.delivery.deliverer import Deliverer
from daemon.delivery.notices import JobNotices, NoticeSettings
from daemon.delivery.outbox import DecisionStore
from policies.model import REASON_PREFIX, Action, Decision, FaultDomain, idempotency_key

ROOT = Path(__file__).resolve().parent.parent
JOBS = 4
JOB = """#!/bin/bash
trap 'date +%s.%N >> {marker}' USR1
touch {marker}.ready
while true; do sleep 0.05; done
"""


def _submit(env: dict[str, str], work: Path) -> tuple[list[str], list[Path]]:
    ids, markers = [], []
    for i in range(JOBS):
        marker = work / f"marker.{i}"
        script = work / f"job{i}.sh"
        script.write_text(JOB.replace("{marker}", str(marker)))
        script.chmod(0o755)
        argv = [
            "sbatch",
            "--parsable",
            "-w",
            "gpu01",
            "-n1",
            "--mem=10",
            "-o",
            "/dev/null",
            str(script),
        ]
        out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
        ids.append(out.stdout.strip().split(";")[0])
        markers.append(marker)
    return ids, markers


def _lines(markers: list[Path]) -> list[int]:
    return [len(m.read_text().splitlines()) if m.exists() else 0 for m in markers]


async def _poll(done: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise RuntimeError("notice_latency: timed out waiting")
        await asyncio.sleep(0.005)


async def _until_told(markers: list[Path], before: list[int], t0: float) -> float:
    """ms from t0 (wall clock) until every job's trap appended a line after ``before``."""
    deadline = time.monotonic() + 30
    while True:
        now = _lines(markers)
        if all(n > b for n, b in zip(now, before, strict=True)):
            last = max(float(m.read_text().splitlines()[-1]) for m in markers)
            return (last - t0) * 1000
        if time.monotonic() > deadline:
            raise RuntimeError(f"notice_latency: not every job was signalled ({now} vs {before})")
        await asyncio.sleep(0.002)


async def _measure(values: dict[str, str], work: Path, samples: int) -> list[Row]:
    conf = Path(values["SLURM_CONF"])
    env = dict(os.environ, SLURM_CONF=str(conf))
    ids, markers = _submit(env, work)
    jobs = SlurmJobs(SlurmClient(None, slurm_conf=conf, timeout_s=20))
    # Running, with the trap set (a USR1 before it would end the job).
    await _poll(lambda: all(Path(f"{m}.ready").exists() for m in markers))
    store = DecisionStore(work / "outbox.sqlite3")
    sink = SlurmSink(SlurmClient(None, slurm_conf=conf, timeout_s=20))
    deliverer = Deliverer(store, sink, retry_initial_s=0.05, retry_max_s=0.5)
    notices = JobNotices(store, jobs, NoticeSettings(checkpoint_grace_s=3600.0))
    deliverer.on_settled = notices.settled
    tasks = [asyncio.create_task(c) for c in (deliverer.run(), notices.run(), store.run())]

    async def decided(i: int) -> float:
        before = _lines(markers)
        t0 = time.time()
        d = Decision(
            "gpu01",
            Action.DRAIN,
            f"{REASON_PREFIX} bench #{i}",
            FaultDomain.GPU,
            float(i),
            idempotency_key("gpu01", Action.DRAIN, 2 * i + 1),
        )
        store.submit(d)
        took = await _until_told(markers, before, t0)
        resume = Decision(
            "gpu01",
            Action.RESUME,
            f"{REASON_PREFIX} bench resume #{i}",
            FaultDomain.GPU,
            i + 0.5,
            idempotency_key("gpu01", Action.RESUME, 2 * i + 2),
        )
        store.submit(resume)
        await _poll(lambda: not store.pending() and notices.current("gpu01") is None)
        return took

    async def bare() -> float:
        before = _lines(markers)
        t0 = time.time()
        argv = ["scancel", "--signal=USR1", "--full", *ids]
        proc = await asyncio.create_subprocess_exec(*argv, env=env)
        await proc.wait()
        return await _until_told(markers, before, t0)

    try:
        counter = iter(range(10_000))
        await decided(next(counter))  # warm up both
        await bare()
        lat: list[float] = []
        ref: list[float] = []
        for _ in range(samples):  # interleaved, so both see the same machine
            lat.append(await decided(next(counter)))
            ref.append(await bare())
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        store.close()
        await (await asyncio.create_subprocess_exec("scancel", *ids, env=env)).wait()
    return latency_rows(
        f"decision->{JOBS} jobs signalled, real slurmctld 22.05",
        lat,
        "bare scancel --signal=USR1 --full",
        ref,
    )


def measure(samples: int = 30) -> list[Row]:
    """p50 / p99 of decision-to-every-job-signalled against a bare scancel."""
    work = Path(tempfile.mkdtemp(prefix="rg-bench-notice-", dir="/tmp"))
    try:
        values = start_slurm(work, cpus=JOBS, who="notice_latency")
        return asyncio.run(_measure(values, work, samples)) if values is not None else []
    finally:
        # Every job of this cluster, whatever failed: a slurmstepd outlives its slurmd.
        conf = work / "etc" / "slurm.conf"
        if conf.exists():
            env = dict(os.environ, SLURM_CONF=str(conf))
            subprocess.run(["scancel", "--full", "-u", "root"], env=env, check=False, timeout=30)
        stop_slurm(work)


if __name__ == "__main__":
    from bench.report import render

    print(render(measure()))
