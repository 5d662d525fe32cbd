"""Builds the fleet view for a daemon from its config, and its metrics."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from adapters.schedulers.listing import FollowingLister, NodeLister
from daemon.cluster.agent import EtcdAgent
from daemon.cluster.etcd_connect import etcd_client
from daemon.cluster.fleet import Fleet
from daemon.cluster.leader import Feed, RackLeader
from daemon.cluster.scheduler_view import SchedulerView
from daemon.cluster.shared_view import SharedView
from daemon.config import Config
from daemon.loops import run_in
from daemon.service.engine import PolicyEngine
from daemon.service.runner import SourceRunner


def rack_sources(config: Config) -> set[str]:
    """The sources that watch the rack (PDU over SNMP, cooling unit over OPC-UA), not the node."""
    return {name for name, src in config.sources.items() if src.type != "nvml"}


def build_leader(
    fleet: Fleet | None,
    config: Callable[[], Config],
    runners: Callable[[], list[SourceRunner]],
    feed: Feed,
) -> RackLeader | None:
    """With etcd and rack sources, one agent per rack polls them (None: each polls its own)."""
    if fleet is None or fleet.etcd is None or not rack_sources(config()):
        return None
    return RackLeader(
        fleet.etcd,
        fleet.rack,
        lambda: [r for r in runners() if r.name in rack_sources(config())],
        feed,
    )


def build_fleet(
    config: Config, lister: NodeLister | None, engine: PolicyEngine, rng: random.Random
) -> Fleet | None:
    """The fleet for this config (None: a lone agent, as before), wired into ``engine``.

    ``lister``: the scheduler backend's node listing, where it has one.
    """
    c = config.cluster
    agent = None
    if c.etcd:
        client = etcd_client(c)
        agent = EtcdAgent(
            client, config.node.name, prefix=c.etcd_prefix, lease_ttl_s=c.lease_ttl_s, rng=rng
        )
    view = None
    if c.view_interval_s > 0 and lister is not None:
        s = engine.settings
        view = SchedulerView(
            lister,
            interval_s=c.view_interval_s,
            horizon_s=max(s.storm_window_s, s.resume_window_s),
            racks={**c.rack_of(), config.node.name: config.node.rack},
            rng=rng,
            budget_reads_per_s=c.view_budget_reads_per_s,
            shared=SharedView(agent) if agent is not None else None,
        )
    if view is None and agent is None:
        return None
    fleet = Fleet(
        config.node.name,
        engine.rack,
        lambda: engine.settings,
        scheduler=view,
        etcd=agent,
        claim_timeout_s=c.claim_timeout_s,
    )
    ledger_view = engine.cluster_view
    engine.cluster_view = lambda now: fleet.view(ledger_view(now), now)
    engine.gate = fleet
    return fleet


async def run_fleet(fleet: Fleet, leader: RackLeader | None = None) -> None:
    """The scheduler reads, the etcd agent and the rack leader, until cancelled."""
    async with asyncio.TaskGroup() as tg:
        if leader is not None:
            run_in(tg, "rack-leader", leader.run, what=f"{fleet.node}: rack leader")
        if fleet.scheduler is not None:
            run_in(tg, "cluster-view", fleet.scheduler.run, what=f"{fleet.node}: cluster view")
        if fleet.etcd is not None:
            run_in(tg, "etcd", fleet.etcd.run, what=f"{fleet.node}: etcd agent")


class FleetCollector:
    """rackguard_cluster_* metrics."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet

    def collect(self) -> Iterator[Metric]:
        """Degraded flag, etcd failures, view reads and rejected views, claims granted/refused."""
        f = self.fleet
        yield GaugeMetricFamily(
            "rackguard_cluster_degraded",
            "1 while the configured fleet coordination (etcd, scheduler view) is not working.",
            value=1.0 if f.degraded else 0.0,
        )
        if f.etcd is not None:
            yield CounterMetricFamily(
                "rackguard_etcd_unreachable",
                "Times etcd was found unreachable (the agent degraded).",
                value=f.etcd.failures,
            )
            bad = CounterMetricFamily(
                "rackguard_etcd_bad_values",
                "Values read from etcd that were not what rackguard writes (ignored), by kind.",
                labels=["kind"],
            )
            for kind, n in sorted(f.etcd.values.bad.items()):
                bad.add_metric([kind], n)
            yield bad
        if f.scheduler is not None:
            yield CounterMetricFamily(
                "rackguard_cluster_view_reads",
                "Full node reads of the scheduler made by this agent (the cluster view).",
                value=f.scheduler.reads,
            )
            if isinstance(f.scheduler.lister, FollowingLister):
                watch = CounterMetricFamily(
                    "rackguard_cluster_node_watch",
                    "The node watch (Kubernetes, the elected reader only): LIST pages, watch"
                    " requests, relists after 410, bookmarks, events taken and lines that did"
                    " not decode (skipped), by kind.",
                    labels=["kind"],
                )
                for kind, n in sorted(f.scheduler.lister.watch_counts().items()):
                    watch.add_metric([kind], n)
                yield watch
            if f.scheduler.shared is not None:
                yield CounterMetricFamily(
                    "rackguard_cluster_view_rejected",
                    "Shared views in etcd that did not decode (ignored).",
                    value=f.scheduler.shared.rejected,
                )
        claims = CounterMetricFamily(
            "rackguard_cluster_claims", "Fleet claims, by outcome.", labels=["outcome"]
        )
        claims.add_metric(["granted"], f.claims_granted)
        claims.add_metric(["refused"], f.claims_refused)
        yield claims
