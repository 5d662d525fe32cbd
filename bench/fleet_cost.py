"""Fleet coordination costs: etcd claims, 1,000 contending agents, one scheduler-view read.

- Claim latency p50 / p99 (a predictive drain's claim: snapshot txn, trip lease,
  claim txn) against a bare etcd put, both on the same real etcd in this run.
- 1,000 agents (asyncio tasks in one process, each with its own lease) claiming a
  cluster budget of 10 at once, as in a CRAC loss: how many were granted (must be
  exactly 10), claim p99, and the etcd server's CPU for the burst.
- One scheduler-view read (GET /slurm/<v>/nodes + ClusterView) of a fake slurmrestd
  holding 1,000 and 10,000 nodes, in a separate process; reference: a one-node
  read of the same server (what the reconciler reads per node today).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import tempfile
import time
from pathlib import Path

from adapters.schedulers.slurm.auth import JwtToken
from adapters.schedulers.slurm.client import SlurmClient
from adapters.schedulers.slurm.sink import SlurmSink
from bench.delivery_latency import percentile
from bench.report import Row
from daemon.cluster.claims import Budgets, Claims
from daemon.cluster.etcd import EtcdClient
from daemon.cluster.scheduler_view import SchedulerView
from fakes.etcd_server import EtcdServer, etcd_available
from fakes.slurmrestd import FakeSlurmrestd

BIG = Budgets(10**6, 10**6, 10**6, 600.0, 1, 60.0)


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _claim_latency(url: str, samples: int) -> list[Row]:
    client = EtcdClient([url], timeout_s=5.0)
    try:
        c = Claims(client, "bench", "/bench-latency/")
        c.lease = await client.grant(60)
        claims, puts = [], []
        for i in range(samples):
            c.node = f"n{i}"
            t0 = time.perf_counter()
            granted = await c.claim_drain("r", True, BIG)
            claims.append((time.perf_counter() - t0) * 1000)
            assert granted.granted
            await client.delete("/bench-latency/", prefix=True)  # steady state: few keys
            t0 = time.perf_counter()
            await client.put("/bench-put/k", f"n{i}", c.lease)
            puts.append((time.perf_counter() - t0) * 1000)
    finally:
        await client.close()
    return [
        Row(
            "etcd drain claim p50",
            percentile(claims, 50),
            "ms",
            "bare etcd put p50",
            percentile(puts, 50),
        ),
        Row(
            "etcd drain claim p99",
            percentile(claims, 99),
            "ms",
            "bare etcd put p99",
            percentile(puts, 99),
        ),
    ]


async def _contention(server: EtcdServer, agents: int, budget: int) -> list[Row]:
    client = EtcdClient([server.url], timeout_s=30.0)
    try:
        prefix = "/bench-contention/"
        claims = [Claims(client, f"node{i:04d}", prefix) for i in range(agents)]
        leases = await asyncio.gather(*(client.grant(60) for _ in claims))
        for c, lease in zip(claims, leases, strict=True):
            c.lease = lease
        b = Budgets(budget, budget, 10**6, 600.0, 1, 60.0)
        lat: list[float] = []

        async def one(c: Claims) -> bool:
            t0 = time.perf_counter()
            g = await c.claim_drain(f"rack{int(c.node[4:]) % 50}", True, b)
            lat.append((time.perf_counter() - t0) * 1000)
            return g.granted

        pid = server.pid()
        cpu0 = _cpu_s(pid) if pid else 0.0
        t0 = time.perf_counter()
        granted = sum(await asyncio.gather(*(one(c) for c in claims)))
        wall = time.perf_counter() - t0
        cpu = (_cpu_s(pid) - cpu0) if pid else float("nan")
        held, _ = await client.get_prefix(prefix + "drain/cluster/")
    finally:
        await client.close()
    return [
        Row(
            f"{agents} agents claiming a budget of {budget}: granted",
            float(granted),
            "nodes",
            "held in etcd after",
            float(len(held)),
            "exactly 10",
            granted == budget == len(held),
        ),
        Row(
            f"{agents} agents: claim p99",
            percentile(lat, 99),
            "ms",
            "claim p50",
            percentile(lat, 50),
        ),
        Row(f"{agents} agents: etcd CPU for the burst", cpu, "s", "burst wall time", wall),
    ]


def _serve(nodes: int, ready: multiprocessing.Queue[str]) -> None:
    async def main() -> None:
        fake = FakeSlurmrestd([f"gpu{i:05d}" for i in range(nodes)])
        ready.put(await fake.start())
        await asyncio.Event().wait()

    asyncio.run(main())


async def _view_read(url: str, token: Path, rounds: int) -> tuple[float, float]:
    sink = SlurmSink(SlurmClient(url, token=JwtToken(token)))
    view = SchedulerView(sink, interval_s=10.0, horizon_s=600.0)
    try:
        await sink.read_state(["gpu00000"])
        full, one = [], []
        for _ in range(rounds):
            t0 = time.perf_counter()
            await view.read_once()
            full.append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            await sink.read_state(["gpu00000"])
            one.append((time.perf_counter() - t0) * 1000)
    finally:
        await sink.close()
    return percentile(full, 50), percentile(one, 50)


def _scheduler_view_rows(tmp: Path) -> list[Row]:
    token = tmp / "jwt"
    token.write_text("token-root\n")
    rows = []
    for nodes in (1000, 10000):
        ready: multiprocessing.Queue[str] = multiprocessing.Queue()
        proc = multiprocessing.Process(target=_serve, args=(nodes, ready), daemon=True)
        proc.start()
        try:
            url = ready.get(timeout=30)
            full, one = asyncio.run(_view_read(url, token, 10 if nodes > 1000 else 30))
        finally:
            proc.terminate()
            proc.join()
        rows.append(
            Row(f"scheduler-view read, {nodes} nodes (p50)", full, "ms", "one-node read p50", one)
        )
    return rows


def measure(samples: int = 300, agents: int = 1000) -> list[Row]:
    """Every fleet row; etcd rows are left out (with a row saying why) when etcd is absent."""
    rows: list[Row] = []
    why = etcd_available()
    if why:
        rows.append(Row(f"etcd rows skipped: {why}", 0.0, ""))
    else:
        server = EtcdServer()
        server.start()
        try:
            rows += asyncio.run(_claim_latency(server.url, samples))
            rows += asyncio.run(_contention(server, agents, 10))
        finally:
            server.close()
    with tempfile.TemporaryDirectory() as tmp:
        rows += _scheduler_view_rows(Path(tmp))
    return rows


if __name__ == "__main__":
    from bench.report import render

    print(render(measure()))
