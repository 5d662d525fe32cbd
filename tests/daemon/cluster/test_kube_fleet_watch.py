"""The Kubernetes fleet view on a real etcd: the one elected reader keeps the node list by one
watch on the fake API server (over HTTP), the rest take its published view and ask nothing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from adapters.schedulers.kubernetes.client import KubeClient, connection
from adapters.schedulers.kubernetes.listing import RACK_LABEL
from adapters.schedulers.kubernetes.sink import KubernetesSink
from daemon.cluster.agent import EtcdAgent
from daemon.cluster.etcd import EtcdClient
from daemon.cluster.fleet import Fleet
from daemon.cluster.scheduler_view import SchedulerView
from daemon.cluster.shared_view import SharedView
from daemon.service.cluster import FleetCollector
from fakes.etcd_server import EtcdServer
from fakes.kube_api import FakeKubeApi
from policies.model import REASON_PREFIX, Action, Decision, FaultDomain, idempotency_key
from policies.settings import PolicySettings
from tests.support.etcd import stop_all
from tests.support.secrets import write_secret
from tests.support.wait import wait_until

NODES = ("n1", "n2", "n3")
INTERVAL = 0.4


@dataclass
class Kube:
    api: FakeKubeApi
    views: list[SchedulerView]
    sinks: list[KubernetesSink]
    tasks: dict[SchedulerView, list[asyncio.Task[None]]]


@pytest.fixture
async def kube(etcd_server: EtcdServer, prefix: str, tmp_path: Path) -> AsyncIterator[Kube]:
    api = FakeKubeApi()
    for name in NODES:
        api.add_node(name)
        api.nodes[name]["metadata"]["labels"][RACK_LABEL] = "r1"
    await api.start()
    token = tmp_path / "token"
    write_secret(token, "test-token\n")
    sinks = [
        KubernetesSink(KubeClient(connection(api_url=api.url, token_file=token))) for _ in NODES
    ]
    agents = [
        EtcdAgent(EtcdClient([etcd_server.url]), n, prefix=prefix, lease_ttl_s=3) for n in NODES
    ]
    views = [
        SchedulerView(
            sink,
            interval_s=INTERVAL,
            horizon_s=600.0,
            budget_reads_per_s=0.01,
            shared=SharedView(agent),
        )
        for sink, agent in zip(sinks, agents, strict=True)
    ]
    tasks = {
        v: [asyncio.create_task(a.run()), asyncio.create_task(v.run())]
        for v, a in zip(views, agents, strict=True)
    }
    yield Kube(api, views, sinks, tasks)
    await stop_all((t for ts in tasks.values() for t in ts), agents, sinks)
    await api.stop()


def metric_counts(view: SchedulerView) -> dict[str, float]:
    """rackguard_cluster_node_watch by kind, as a scrape of this agent would read it."""
    collector = FleetCollector(Fleet("n", "r1", PolicySettings, scheduler=view))
    return {
        s.labels["kind"]: s.value
        for m in collector.collect()
        if m.name == "rackguard_cluster_node_watch"
        for s in m.samples
    }


def reading(v: SchedulerView) -> bool:
    return v.shared is not None and v.shared.reading


async def test_one_watch_for_the_cluster_and_a_taint_seen_by_all_within_the_interval(
    kube: Kube,
) -> None:
    api, views = kube.api, kube.views
    await wait_until(lambda: all(v.snapshot is not None for v in views), timeout=10)
    (reader,) = [v for v in views if reading(v)]
    sink = kube.sinks[views.index(reader)]
    assert sink.watch.following and len(api.watchers) == 1
    assert not any(s.watch.following for s in kube.sinks if s is not sink)
    lists, watches = api.node_lists, api.node_watches

    t0 = time.monotonic()
    await kube.sinks[0].deliver(
        Decision("n2", Action.DRAIN, f"{REASON_PREFIX} hot", FaultDomain.GPU, 0.0,
                 idempotency_key("n2", Action.DRAIN, 1))
    )  # fmt: skip
    await wait_until(
        lambda: all(v.snapshot is not None and "n2" in v.snapshot.out for v in views),
        timeout=10,
        what="drain seen by every agent",
    )
    # One view interval, the publish and the etcd watch (room for a loaded 2-core box).
    assert time.monotonic() - t0 <= INTERVAL + 1.0
    await asyncio.sleep(5 * INTERVAL)  # many intervals: still no LIST, still one watch
    assert (api.node_lists, api.node_watches, len(api.watchers)) == (lists, watches, 1)
    assert all(v.reads == 0 for v in views)  # nobody LISTs on a cadence
    # The reader's metrics count what the API server served it, followers' count nothing.
    counts = [metric_counts(v) for v in views]
    assert counts[views.index(reader)]["watches"] == watches >= 1
    assert counts[views.index(reader)]["events"] >= 1  # the drain's taint came as an event
    assert all(c["watches"] == 0 for i, c in enumerate(counts) if views[i] is not reader)


async def test_a_dead_reader_s_successor_opens_its_own_watch(kube: Kube) -> None:
    api, views = kube.api, kube.views
    await wait_until(lambda: all(v.snapshot is not None for v in views), timeout=10)
    dead = next(v for v in views if reading(v))
    for t in kube.tasks[dead]:
        t.cancel()
    await asyncio.gather(*kube.tasks[dead], return_exceptions=True)
    await kube.sinks[views.index(dead)].close()  # the process is gone: its stream too
    rest = [v for v in views if v is not dead]
    api.edit_node("n3", {"spec": {"unschedulable": True}})  # foreign: seen, not counted
    await wait_until(lambda: sum(reading(v) for v in rest) == 1, timeout=10, what="new reader")
    successor = next(v for v in rest if reading(v))
    watch = kube.sinks[views.index(successor)].watch
    await wait_until(lambda: watch.synced.is_set() and len(api.watchers) == 1, timeout=5)
    assert watch.nodes["n3"].view.drained and api.node_watches >= 2
