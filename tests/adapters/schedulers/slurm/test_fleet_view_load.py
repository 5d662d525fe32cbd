"""The fleet's full node reads against a real slurmctld: within the budget, one reader with etcd.

Counted at the controller (``sdiag``: REQUEST_NODE_INFO) and in the agents, not timed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from adapters.schedulers.listing import ListedNode
from adapters.schedulers.slurm.auth import JwtToken
from adapters.schedulers.slurm.client import SlurmClient
from adapters.schedulers.slurm.sink import SlurmSink
from bench.delivery_latency import start_slurm, stop_slurm
from daemon.cluster.agent import EtcdAgent
from daemon.cluster.etcd import EtcdClient
from daemon.cluster.scheduler_view import SchedulerView
from daemon.cluster.shared_view import SharedView
from fakes.etcd_server import EtcdServer
from tests.support.etcd import served_etcd
from tests.support.slurm import NODES, Cluster
from tests.support.wait import wait_until

pytestmark = pytest.mark.slurm

OURS = "rackguard[gpu]: exclude: gpu0 91C at slowdown 90C"


class Counted:
    """The real listing, counting its reads."""

    def __init__(self, sink: SlurmSink) -> None:
        self.sink = sink
        self.reads = 0

    async def list_nodes(self) -> list[ListedNode]:
        self.reads += 1
        return await self.sink.list_nodes()


def node_info_rpcs(cluster: Cluster) -> int:
    out = cluster.run("sdiag").stdout
    m = re.search(r"REQUEST_NODE_INFO\s+\(\s*\d+\)\s+count:(\d+)", out)
    return int(m.group(1)) if m else 0


@pytest.fixture
async def sinks(clean: Cluster) -> AsyncIterator[list[SlurmSink]]:
    made = [
        SlurmSink(
            SlurmClient(
                clean.rest_url,
                token=JwtToken(clean.token_file),
                slurm_conf=clean.conf,
                timeout_s=20.0,
            )
        )
        for _ in NODES
    ]
    yield made
    for s in made:
        await s.close()


async def run_for(views: list[SchedulerView], seconds: float) -> None:
    tasks = [asyncio.create_task(v.run()) for v in views]
    try:
        await asyncio.sleep(seconds)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_the_fleets_full_reads_stay_within_the_budget_counted_at_slurmctld(
    clean: Cluster, sinks: list[SlurmSink]
) -> None:
    # One agent per node; a 0.2 s interval would be 20 reads/s for 4 agents, the
    # budget of 2 reads/s makes each read every 4 nodes / 2 = 2 s.
    interval, budget, seconds = 0.2, 2.0, 6.0
    listers = [Counted(s) for s in sinks]
    views = [
        SchedulerView(lister, interval_s=interval, horizon_s=600.0, budget_reads_per_s=budget)
        for lister in listers
    ]
    clean.run("sdiag", "--reset")
    await run_for(views, seconds)
    reads = sum(c.reads for c in listers)
    at_ctld = node_info_rpcs(clean)
    # Each agent's first read, then the budget (steps jittered by at most 10 %).
    bound = len(views) + budget * seconds / 0.9
    assert len(views) <= reads <= bound, (reads, bound)
    assert reads <= at_ctld <= bound + 2, (at_ctld, reads)  # REST GET /nodes: one RPC each
    assert reads < len(views) * seconds / interval / 4  # the unbudgeted pattern: 120
    assert all(v.budget_interval() == pytest.approx(len(NODES) / budget) for v in views)
    assert all(v.snapshot is not None and v.snapshot.total == len(NODES) for v in views)


@pytest.fixture
def etcd() -> Iterator[EtcdServer]:
    yield from served_etcd()


@contextlib.asynccontextmanager
async def shared_fleet(
    listers: list[Counted], names: list[str], url: str, prefix: str, interval: float, ttl: int
) -> AsyncIterator[list[SchedulerView]]:
    """One etcd agent and scheduler view per name, running until the block ends."""
    agents = [
        EtcdAgent(EtcdClient([url], timeout_s=2.0), n, prefix=prefix, lease_ttl_s=ttl)
        for n in names
    ]
    views = [
        SchedulerView(lister, interval_s=interval, horizon_s=600.0, shared=SharedView(a))
        for lister, a in zip(listers, agents, strict=True)
    ]
    tasks = [asyncio.create_task(a.run()) for a in agents]
    tasks += [asyncio.create_task(v.run()) for v in views]
    try:
        yield views
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for a in agents:
            with contextlib.suppress(Exception):
                await a.close()


async def test_with_etcd_one_agent_reads_and_a_peer_sees_a_drain_within_one_interval(
    clean: Cluster, sinks: list[SlurmSink], etcd: EtcdServer
) -> None:
    interval = 1.0
    listers = [Counted(s) for s in sinks]
    async with shared_fleet(listers, list(NODES), etcd.url, "/t-view/", interval, 3) as views:
        await wait_until(lambda: all(v.snapshot is not None for v in views), timeout=10)
        readers = [v for v in views if v.shared is not None and v.shared.reading]
        assert len(readers) == 1
        followers = [v for v in views if v not in readers]
        before = [c.reads for c in listers]
        target = next(n for n in NODES if readers[0].shared and n != readers[0].shared.agent.node)
        await asyncio.sleep(interval * 1.2)  # mid-interval, wherever the reader's grid is
        clean.scontrol("update", f"nodename={target}", "state=drain", f"reason={OURS}")
        t0 = time.monotonic()
        await wait_until(
            lambda: all(target in (f.snapshot.out if f.snapshot else {}) for f in followers),
            timeout=5,
        )
        seen_after = time.monotonic() - t0
        # The reader's next read (at most one interval away), the read itself and the watch.
        assert seen_after <= interval + 0.5, seen_after
        # Nobody but the reader read the scheduler meanwhile.
        after = [c.reads for c in listers]
        for v, c, b, n in zip(views, listers, before, after, strict=True):
            assert (n > b) == (v in readers), (c, b, n)
        for f in followers:
            out = f.snapshot.out[target] if f.snapshot else None
            assert out is not None and out.domain.value == "gpu" and out.rack == ""


@pytest.fixture(scope="module")
def big() -> Iterator[dict[str, str]]:
    """A real slurmctld holding 10,002 nodes (10,000 never run a slurmd), for this module."""
    if os.geteuid() != 0:
        pytest.skip("the real-Slurm tests run as root (munged, slurmctld, slurmd); CI does")
    work = Path(tempfile.mkdtemp(prefix="rg-slurm-big-", dir="/tmp"))
    try:
        values = start_slurm(work, who="test", nodes=2, extra_nodes=10_000)
        assert values is not None, "scripts/start-slurm.sh failed (its stderr is above)"
        yield values
    finally:
        stop_slurm(work)


async def test_in_a_10000_node_cluster_with_etcd_a_peer_sees_a_drain_within_one_interval(
    big: dict[str, str], etcd: EtcdServer
) -> None:
    interval = 2.0
    conf = Path(big["SLURM_CONF"])
    sink = SlurmSink(SlurmClient(None, slurm_conf=conf, timeout_s=30.0))  # scontrol
    names = [f"x{i:05d}" for i in range(1, 21)]  # 20 agents of the 10,000
    listers = [Counted(sink) for _ in names]
    env = dict(os.environ, SLURM_CONF=str(conf))
    try:
        async with shared_fleet(listers, names, etcd.url, "/t-big/", interval, 5) as views:
            await wait_until(lambda: all(v.snapshot is not None for v in views), timeout=30)
            assert all(v.snapshot is not None and v.snapshot.total == 10_002 for v in views)
            followers = [v for v in views if v.shared is not None and not v.shared.reading]
            assert len(followers) == len(views) - 1
            await asyncio.sleep(interval * 0.6)
            drain = await asyncio.create_subprocess_exec(
                "scontrol", "update", "nodename=x09999", "state=drain", f"reason={OURS}", env=env
            )
            assert await drain.wait() == 0
            t0 = time.monotonic()
            await wait_until(
                lambda: all("x09999" in (f.snapshot.out if f.snapshot else {}) for f in followers),
                timeout=10,
            )
            seen_after = time.monotonic() - t0
            # At most one interval to the reader's next read, then the read (~0.3 s of
            # scontrol and parsing for 10,002 nodes here) and the watch.
            assert seen_after <= interval + 1.5, seen_after
            assert sum(c.reads for c in listers) == sum(
                c.reads for c, v in zip(listers, views, strict=True) if v not in followers
            )
            out = followers[0].snapshot.out["x09999"] if followers[0].snapshot else None
            assert out is not None and out.rack == "r250"
    finally:
        await sink.close()
