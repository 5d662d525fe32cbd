"""Rack evidence shared, not re-polled: one agent per rack polls the PDUs and the cooling unit.

With etcd, the rack's agents race for ``leader/<rack>`` (``EtcdAgent.stand``:
bound to the winner's lease, which it takes for this);
the holder runs the rack sources (SNMP, OPC-UA) and publishes each poll's
readings to ``evidence/<rack>/<source>`` (bound to the same lease) with the
publisher, its lease and each reading's age; the others run none of them and
feed the published readings into their own state store.

A publication is evidence only when it decodes, names the current leader and
its lease (the leader key's value and lease, and the evidence key's lease), and
arrived by the watch less than one lease TTL ago: its readings are stamped on
this host's monotonic clock (arrival minus their age), so no decision compares
the publisher's wall clock with ours. Anything else is UNKNOWN: a rack source
with no such publication for a TTL is polled here (a silent leader is never
waited on longer than that), and so is every one while etcd is away.

A dead leader's key goes with its lease (one TTL), and the next agent to see it
gone takes over; a leader whose lease is gone (etcd lost it, or this agent
stalled past it) has lost the lead and stands again under its new lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import msgspec

from daemon.cluster.agent import EtcdAgent
from daemon.cluster.etcd import EtcdError
from daemon.cluster.etcd_values import Evidence, PublishedReading
from daemon.loops import run_in
from daemon.poller import Poller
from policies.model import Quality, Reading, SensorKind

log = logging.getLogger(__name__)

Feed = Callable[[str, Sequence[Reading]], None]


class RackSource(Protocol):
    """A rack source's runner (daemon/service/runner.py): what the leader starts and stops."""

    @property
    def name(self) -> str: ...
    @property
    def first_attempt(self) -> asyncio.Event: ...
    async def run(self) -> None: ...


class RackLeader:
    """Runs the rack sources here when this agent leads its rack (or etcd is away)."""

    def __init__(
        self,
        agent: EtcdAgent,
        rack: str,
        runners: Callable[[], Sequence[RackSource]],
        feed: Feed,
    ) -> None:
        self.agent = agent
        self.rack = rack
        agent.rack = rack  # the agent mirrors this rack's evidence (from its next connect)
        self._runners = runners  # the rack sources configured now (re-read: reloads)
        self._feed = feed
        self.leading = False
        self._tasks: dict[RackSource, asyncio.Task[None]] = {}
        self._tg: asyncio.TaskGroup | None = None  # while running: the rack sources' tasks
        self._imported: dict[str, int] = {}  # source -> mod_revision fed
        self._following: tuple[str, int] = ("", 0)  # (leader, its lease) followed now
        self._following_since = 0.0  # monotonic
        # A pass at every change etcd mirrors, and a third of the lease TTL at most apart.
        # etcd failures are the agent's to report (mark_down): none reach the poller.
        self.poller = Poller(
            f"{agent.node}: rack {rack} leader",
            self._pass,
            interval_s=agent.lease_ttl_s / 3,
            failures=(),
            on_change=lambda old, new, why: None,
            wake=agent.changed,
        )

    def owns(self, runner: RackSource) -> bool:
        """The runner is a rack source: this object starts and stops it."""
        return runner in self._runners()

    @property
    def leader(self) -> str:
        """Who holds the rack's lead ("" when nobody, or etcd is away)."""
        kv = self.agent.get("leader", self.rack)
        return (self.agent.values.node_name(kv, "leader") or "?") if kv is not None else ""

    def on_readings(self, source: str, readings: Sequence[Reading]) -> None:
        """A poll of a rack source here: publish it for the rack when leading."""
        if not self.leading or source not in {r.name for r in self._runners()}:
            return
        now = time.monotonic()
        lease = self.agent.claims.lease
        if lease == 0:
            return  # between leases: a publication without one would never expire
        body = msgspec.json.encode(
            Evidence(self.agent.node, lease, time.time(), [_encode(r, now) for r in readings])
        )
        key = self.agent.claims.key("evidence", self.rack, source)
        self.agent.submit(lambda: self._put(key, body, lease))

    async def _put(self, key: str, body: bytes, lease: int) -> None:
        with contextlib.suppress(EtcdError):
            await self.agent.etcd.put(key, body, lease)

    async def run(self) -> None:
        """Elect, start or stop the rack sources, import the leader's readings; until cancelled."""
        try:
            async with asyncio.TaskGroup() as tg:  # the rack sources: ended with it
                self._tg = tg
                await self.poller.run()
        finally:
            self._tg = None
            self._tasks.clear()

    async def _pass(self) -> None:
        await self._elect()
        if self.leading or not self.agent.up:
            self._sync(self._runners())
            return
        shared = self._import()
        self._sync([r for r in self._runners() if r.name not in shared])

    async def _elect(self) -> None:
        was = self.leading
        self.leading = await self.agent.stand("leader", self.rack)
        if self.leading != was:
            log.info(
                "%s: %s rack %s's sources",
                self.agent.node,
                "polling" if self.leading else f"following {self.leader or 'nobody'} for",
                self.rack,
            )

    def _sync(self, wanted: Sequence[RackSource]) -> None:
        for runner in [r for r in self._tasks if r not in wanted]:
            self._tasks.pop(runner).cancel()
        for runner in wanted:
            if runner not in self._tasks and self._tg is not None:
                self._tasks[runner] = run_in(
                    self._tg,
                    f"source:{runner.name}",
                    runner.run,
                    what=f"{runner.name}: rack source",
                )
                self._imported.pop(runner.name, None)

    def _import(self) -> set[str]:
        """Feed the leader's fresh publications; the rack sources they cover now."""
        agent, now = self.agent, time.monotonic()
        held = agent.get("leader", self.rack)
        leader = (self.leader, held.lease if held is not None else 0)
        if leader != self._following:
            self._following, self._following_since = leader, now
        patient = now - self._following_since < agent.lease_ttl_s  # a new leader's first poll
        shared = set()
        for runner in self._runners():
            kv = agent.get("evidence", self.rack, runner.name)
            arrived = agent.put_at.get(kv.key) if kv is not None else None
            if kv is None or held is None or arrived is None:
                if patient:
                    shared.add(runner.name)
                continue
            if now - arrived > agent.lease_ttl_s:
                continue  # the leader has been silent on this source for a TTL: poll it here
            body = agent.values.decode(kv, Evidence, "evidence")
            if body is None:
                continue
            if (body.by, body.lease) != leader or kv.lease != held.lease:
                agent.values.bad_value(
                    kv, "evidence", f"published by {body.by!r}, not by the rack's leader"
                )
                continue
            shared.add(runner.name)
            if self._imported.get(runner.name) == kv.mod_revision:
                continue
            self._imported[runner.name] = kv.mod_revision
            try:
                readings = [_decode(r, arrived) for r in body.readings]
            except ValueError as err:
                agent.values.bad_value(kv, "evidence", str(err))
                continue
            self._feed(runner.name, readings)
            runner.first_attempt.set()  # readiness: the rack source has reported, shared
        return shared


def _encode(r: Reading, now: float) -> PublishedReading:
    return PublishedReading(
        r.source,
        r.sensor,
        r.kind.value,
        r.value,
        r.unit,
        r.quality.value,
        max(0.0, now - r.mono),
        r.wall,
        r.reason,
        r.device_ts,
        r.server_ts,
        dict(r.labels),
    )


def _decode(d: PublishedReading, arrived: float) -> Reading:
    """A published reading, stamped on this host's clock: its arrival here minus its age."""
    if not 0.0 <= d.age < 86_400.0:
        raise ValueError(f"reading {d.sensor[:64]!r} has an impossible age {d.age}")
    return Reading(
        d.source,
        d.sensor,
        SensorKind(d.kind),
        d.value,
        d.unit,
        Quality(d.quality),
        arrived - d.age,
        d.wall,
        reason=d.reason,
        device_ts=d.device_ts,
        labels=d.labels,
        server_ts=d.server_ts,
    )
