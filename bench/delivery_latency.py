"""Decision-to-confirmation latency: from the policy's callback (DecisionStore.submit) to the
scheduler confirming the state it read back, p50 and p99.

Two paths, each with a reference measured in the same run:

- the fake slurmrestd's REST write path (Slurm >= 23.02): read, POST, read back;
  reference: one bare authenticated HTTP GET to the same fake;
- a real Slurm 22.05 (slurmctld + slurmd + slurmrestd on loopback, started by
  scripts/start-slurm.sh; needs root): REST read, ``scontrol update``, REST read
  back; reference: one bare ``scontrol update`` of the same kind.

Each sample alternates a drain and a resume of one node, so every sample writes.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp

from adapters.base import SchedulerSink
from adapters.schedulers.slurm.auth import JwtToken
from adapters.schedulers.slurm.client import SlurmClient
from adapters.schedulers.slurm.sink import SlurmSink
from bench.report import Row, median
from daemon.delivery.deliverer import Deliverer
from daemon.delivery.outbox import DecisionStore, Status
from fakes.slurmrestd import FakeSlurmrestd
from policies.model import REASON_PREFIX, Action, Decision, FaultDomain, idempotency_key

ROOT = Path(__file__).resolve().parent.parent


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


async def _latencies(sink: SchedulerSink, db: Path, node: str, samples: int) -> list[float]:
    """Submit-to-confirmed times in ms, one decision at a time."""
    done = asyncio.Event()
    settled: list[Status] = []

    def on_settled(decision: Decision, status: Status, outcome: str) -> None:
        settled.append(status)
        done.set()

    outbox = DecisionStore(db)
    deliverer = Deliverer(
        outbox, sink, retry_initial_s=0.05, retry_max_s=0.5, on_settled=on_settled
    )
    task = asyncio.create_task(deliverer.run())
    out = []
    try:
        for i in range(samples):
            action = Action.DRAIN if i % 2 == 0 else Action.RESUME
            d = Decision(
                node,
                action,
                f"{REASON_PREFIX} bench #{i}",
                FaultDomain.GPU,
                float(i),
                idempotency_key(node, action, i + 1),
            )
            done.clear()
            t0 = time.perf_counter()
            outbox.submit(d)
            await done.wait()
            out.append((time.perf_counter() - t0) * 1000)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        outbox.close()
    if any(s is not Status.CONFIRMED for s in settled):
        raise RuntimeError(f"bench: not every decision was confirmed: {settled}")
    return out


async def _timed(fn: Callable[[], Awaitable[object]], samples: int) -> list[float]:
    out = []
    for _ in range(samples):
        t0 = time.perf_counter()
        await fn()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def latency_rows(name: str, values: list[float], ref_name: str, ref: list[float]) -> list[Row]:
    return [
        Row(f"{name} p50", median(values), "ms", f"{ref_name} p50", median(ref)),
        Row(f"{name} p99", percentile(values, 99), "ms", f"{ref_name} p99", percentile(ref, 99)),
    ]


async def _fake_path(samples: int, work: Path) -> list[Row]:
    fake = FakeSlurmrestd(("gpu01",))
    await fake.start()
    token = work / "jwt"
    token.write_text("token-root")
    token.chmod(0o600)
    sink = SlurmSink(SlurmClient(fake.url, token=JwtToken(token)))
    headers = {"X-SLURM-USER-NAME": "root", "X-SLURM-USER-TOKEN": "token-root"}
    try:
        async with aiohttp.ClientSession(headers=headers) as http:

            async def bare() -> None:
                async with http.get(f"{fake.url}/slurm/v0.0.42/node/gpu01") as resp:
                    await resp.read()

            await _timed(bare, 20)  # warm up both
            await _latencies(sink, work / "warm.db", "gpu01", 10)
            ref = await _timed(bare, samples)
            lat = await _latencies(sink, work / "fake.db", "gpu01", samples)
    finally:
        await sink.close()
        await fake.stop()
    return latency_rows(
        "decision->confirmed, fake slurmrestd (REST)", lat, "bare HTTP GET to the fake", ref
    )


def free_ports(count: int) -> list[int]:
    import random  # noqa: PLC0415

    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 40000)
        ok = True
        for p in range(base, base + count):
            with socket.socket() as s:
                try:
                    s.bind(("0.0.0.0", p))
                except OSError:
                    ok = False
        if ok:
            return list(range(base, base + count))
    raise RuntimeError("no free ports")


def start_slurm(
    work: Path, cpus: int = 1, who: str = "delivery_latency", nodes: int = 1, extra_nodes: int = 0
) -> dict[str, str] | None:
    """A cluster from scripts/start-slurm.sh, or None (with the reason on stderr)."""
    if os.geteuid() != 0:
        print(f"{who}: the real Slurm rows need root; skipped", file=sys.stderr)
        return None
    os.chmod(work, 0o755)  # slurmrestd runs as nobody and reads slurm.conf under it
    ctld, rest, slurmd, *_ = free_ports(2 + nodes)
    env = dict(
        os.environ,
        SLURM_CI_NODES=str(nodes),
        SLURM_CI_EXTRA_NODES=str(extra_nodes),
        SLURM_CI_CPUS=str(cpus),
        SLURM_CI_CTLD_PORT=str(ctld),
        SLURM_CI_REST_PORT=str(rest),
        SLURM_CI_SLURMD_BASE_PORT=str(slurmd),
    )
    started = subprocess.run(
        [str(ROOT / "scripts/start-slurm.sh"), str(work)],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if started.returncode != 0:
        print(f"{who}: Slurm did not start:\n{started.stderr}", file=sys.stderr)
        return None
    return dict(line.split("=", 1) for line in started.stdout.split())


def stop_slurm(work: Path) -> None:
    subprocess.run(
        [str(ROOT / "scripts/stop-slurm.sh"), str(work)],
        check=False,
        env=dict(os.environ, SLURM_CI_PURGE="1"),
        capture_output=True,
        timeout=120,
    )


async def _real_path(values: dict[str, str], work: Path, samples: int) -> list[Row]:
    conf = Path(values["SLURM_CONF"])
    sink = SlurmSink(
        SlurmClient(
            values["SLURM_REST_URL"],
            token=JwtToken(Path(values["SLURM_JWT_FILE"])),
            slurm_conf=conf,
        )
    )
    cenv = dict(os.environ, SLURM_CONF=str(conf))
    flip = [0]

    async def bare() -> None:
        flip[0] += 1
        state = ["state=drain", "reason=bench"] if flip[0] % 2 else ["state=resume"]
        proc = await asyncio.create_subprocess_exec(
            "scontrol", "update", "nodename=gpu01", *state, env=cenv
        )
        await proc.wait()

    try:
        await _latencies(sink, work / "warm.db", "gpu01", 4)
        ref = await _timed(bare, samples)
        if flip[0] % 2:
            await bare()  # leave it in service
        lat = await _latencies(sink, work / "real.db", "gpu01", samples)
    finally:
        await sink.close()
    return latency_rows(
        "decision->confirmed, real slurmctld 22.05 (scontrol)", lat, "bare scontrol update", ref
    )


def measure(samples: int = 200, real_samples: int = 40) -> list[Row]:
    """p50 / p99 of decision-to-confirmation through the fake and the real Slurm."""
    with tempfile.TemporaryDirectory() as tmp:
        rows = asyncio.run(_fake_path(samples, Path(tmp)))
    work = Path(tempfile.mkdtemp(prefix="rg-bench-slurm-", dir="/tmp"))
    try:
        values = start_slurm(work)
        if values is not None:
            rows += asyncio.run(_real_path(values, work, real_samples))
    finally:
        stop_slurm(work)
    return rows


if __name__ == "__main__":
    from bench.report import render

    print(render(measure()))
