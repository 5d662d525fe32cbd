"""The cluster's one scheduler reader on a real etcd: its view taken, garbage and forgeries not."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import partial

import pytest

from adapters.schedulers.base import NodeView
from adapters.schedulers.listing import ListedNode
from daemon.cluster.agent import EtcdAgent
from daemon.cluster.etcd import EtcdClient
from daemon.cluster.fleet import Fleet
from daemon.cluster.scheduler_view import SchedulerView
from daemon.cluster.shared_view import SharedView
from daemon.service.cluster import FleetCollector
from fakes.etcd_server import EtcdServer
from policies.settings import PolicySettings
from tests.support.etcd import stop_all
from tests.support.wait import wait_until

REASON = "rackguard[cooling_loop]: cooling loop failing"


class Listing:
    """A scheduler of three nodes in rack r1, counting its reads."""

    def __init__(self) -> None:
        self.reads = 0
        self.held: set[str] = set()

    async def list_nodes(self) -> list[ListedNode]:
        self.reads += 1
        return [
            ListedNode(
                NodeView(n, drained=n in self.held, reason=REASON if n in self.held else ""),
                rack="r1",
                reason_at=time.time() if n in self.held else None,
            )
            for n in ("n1", "n2", "n3")
        ]


@dataclass
class Agents:
    views: list[SchedulerView]
    listing: Listing
    tasks: dict[SchedulerView, list[asyncio.Task[None]]]


@pytest.fixture
async def fleet(etcd_server: EtcdServer, prefix: str) -> AsyncIterator[Agents]:
    listing = Listing()
    agents = [
        EtcdAgent(EtcdClient([etcd_server.url]), n, prefix=prefix, lease_ttl_s=3)
        for n in ("n1", "n2", "n3")
    ]
    views = [
        SchedulerView(
            listing,
            interval_s=0.4,
            horizon_s=600.0,
            budget_reads_per_s=0.01,  # own reads, without a shared view: every 300 s
            shared=SharedView(a),
        )
        for a in agents
    ]
    tasks = {
        v: [asyncio.create_task(a.run()), asyncio.create_task(v.run())]
        for v, a in zip(views, agents, strict=True)
    }
    yield Agents(views, listing, tasks)
    await stop_all((t for ts in tasks.values() for t in ts), agents)


def shared(v: SchedulerView) -> SharedView:
    assert v.shared is not None
    return v.shared


async def test_one_reader_reads_the_rest_take_its_view_and_garbage_or_forgery_is_not_a_view(
    fleet: Agents,
) -> None:
    views, listing = fleet.views, fleet.listing
    await wait_until(lambda: all(v.snapshot is not None for v in views), timeout=10)
    readers = [v for v in views if shared(v).reading]
    assert len(readers) == 1
    follower = next(v for v in views if v not in readers)
    assert follower.reads == 0 and readers[0].reads == listing.reads
    listing.held.add("n3")
    await wait_until(
        lambda: follower.snapshot is not None and "n3" in follower.snapshot.out, timeout=3
    )
    out = follower.snapshot.out["n3"] if follower.snapshot else None
    assert out is not None and out.rack == "r1" and out.domain.value == "cooling_loop"
    assert follower.snapshot is not None and follower.snapshot.total == 3
    assert follower.reads == 0

    listing.held.clear()
    await wait_until(lambda: follower.snapshot is not None and not follower.snapshot.out)
    agent = shared(follower).agent
    reader = shared(readers[0]).agent
    key = agent.claims.key("view", "out")

    def mirrored(value: bytes) -> bool:
        kv = agent.get("view", "out")
        return kv is not None and kv.value == value

    # Not UTF-8, then the wrong shape, then a well-formed view by someone not the reader
    # (it would put n1 and a node the cluster has not out): none is taken, none crashes.
    for bad in (
        b"\xff\xfe",
        b'{"by": 1, "out": "x"}',
        b'{"by": "mallory", "out": [["n1", "r1", "exclude", "gpu", 0.0, ""]]}',
        b'{"by": "%s", "out": [["zz", "r1", "exclude", "gpu", 0.0, ""]]}' % reader.node.encode(),
    ):
        # The reader's own out set is unchanged: it does not write over these.
        await reader.etcd.put(key, bad, reader.claims.lease)
        await wait_until(partial(mirrored, bad), timeout=3)
        await asyncio.sleep(0.2)  # the follower's ticks
        snap = follower.snapshot
        assert snap is not None and "n1" not in snap.out and "zz" not in snap.out
    assert shared(follower).rejected >= 2  # the two that did not decode, counted
    collector = FleetCollector(Fleet(agent.node, "r1", PolicySettings, scheduler=follower))
    metrics = {m.name: m.samples[0].value for m in collector.collect() if m.samples}
    assert metrics["rackguard_cluster_view_rejected"] == shared(follower).rejected
    assert metrics["rackguard_cluster_view_reads"] == 0
    # The reader republishes on its next change; the follower takes it again.
    listing.held.add("n2")
    await wait_until(
        lambda: follower.snapshot is not None and set(follower.snapshot.out) == {"n2"}, timeout=3
    )
    assert follower.reads == 0


async def test_a_dead_reader_is_replaced_within_its_lease_and_the_view_goes_on(
    fleet: Agents,
) -> None:
    views, listing = fleet.views, fleet.listing
    await wait_until(lambda: all(v.snapshot is not None for v in views), timeout=10)
    dead = next(v for v in views if shared(v).reading)
    for t in fleet.tasks[dead]:  # killed: no revoke, its lease runs out (3 s)
        t.cancel()
    await asyncio.gather(*fleet.tasks[dead], return_exceptions=True)
    rest = [v for v in views if v is not dead]
    t0 = time.monotonic()
    listing.held.add("n1")
    await wait_until(
        lambda: all(v.snapshot is not None and "n1" in v.snapshot.out for v in rest), timeout=10
    )
    # The lease's TTL, then the new reader's first read, published and watched (with
    # room for a loaded 2-core machine).
    assert time.monotonic() - t0 <= 3 + 2 * 0.4 + 2.0
    assert sum(shared(v).reading for v in rest) == 1
    assert sum(v.reads for v in rest) == sum(v.reads for v in rest if shared(v).reading)
