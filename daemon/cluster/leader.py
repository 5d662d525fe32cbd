"""Rack evidence shared, not re-polled: one agent per rack polls the PDUs and the cooling unit.

With etcd, the rack's agents race for ``leader/<rack>`` (bound to their lease);
the holder runs the rack sources (SNMP, OPC-UA) and publishes each poll's
readings to ``evidence/<rack>/<source>`` with their age; the others run none of
them and feed the published readings into their own state store, aged by the
time since publication. A dead leader's key goes with its lease (one TTL), and
the next agent to see it gone takes over. Without etcd, or while it is away,
every agent polls its rack sources itself, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import orjson

from daemon.cluster.agent import EtcdAgent
from daemon.cluster.etcd import EtcdError, absent, put_op
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
        self._runners = runners  # the rack sources configured now (re-read: reloads)
        self._feed = feed
        self.leading = False
        self._tasks: dict[RackSource, asyncio.Task[None]] = {}
        self._imported: dict[str, int] = {}  # source -> mod_revision fed
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
        return kv.value.decode(errors="replace") if kv is not None else ""

    def on_readings(self, source: str, readings: Sequence[Reading]) -> None:
        """A poll of a rack source here: publish it for the rack when leading."""
        if not self.leading or source not in {r.name for r in self._runners()}:
            return
        now = time.monotonic()
        body = orjson.dumps(
            {
                "by": self.agent.node,
                "wall": time.time(),
                "readings": [_encode(r, now) for r in readings],
            }
        )
        key = self.agent.claims.key("evidence", self.rack, source)
        lease = self.agent.claims.lease
        self.agent.submit(lambda: self._put(key, body, lease))

    async def _put(self, key: str, body: bytes, lease: int) -> None:
        with contextlib.suppress(EtcdError):
            await self.agent.etcd.put(key, body, lease)

    async def run(self) -> None:
        """Elect, start or stop the rack sources, import the leader's readings; until cancelled."""
        try:
            await self.poller.run()
        finally:
            stopping = list(self._tasks.values())
            self._sync([])
            await asyncio.gather(*stopping, return_exceptions=True)

    async def _pass(self) -> None:
        await self._elect()
        local = self.leading or not self.agent.up
        self._sync(self._runners() if local else [])
        if not local:
            self._import()

    async def _elect(self) -> None:
        was = self.leading
        if not self.agent.up or not self.agent.claims.lease:
            self.leading = False
        elif self.leader == self.agent.node:
            self.leading = True
        elif not self.leader:
            key = self.agent.claims.key("leader", self.rack)
            try:
                ok, _ = await self.agent.etcd.txn(
                    [absent(key)], [put_op(key, self.agent.node, self.agent.claims.lease)]
                )
            except EtcdError as err:
                self.agent.mark_down(err)
                ok = False
            self.leading = ok
        else:
            self.leading = False
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
            if runner not in self._tasks:
                self._tasks[runner] = asyncio.create_task(
                    runner.run(), name=f"source:{runner.name}"
                )
                self._imported.pop(runner.name, None)

    def _import(self) -> None:
        now, wall = time.monotonic(), time.time()
        for runner in self._runners():
            kv = self.agent.get("evidence", self.rack, runner.name)
            if kv is None or self._imported.get(runner.name) == kv.mod_revision:
                continue
            self._imported[runner.name] = kv.mod_revision
            try:
                body = orjson.loads(kv.value)
                since = max(0.0, wall - float(body["wall"]))
                readings = [_decode(r, now - since) for r in body["readings"]]
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as err:
                log.warning(
                    "%s: bad rack evidence from etcd for %s: %s", self.agent.node, runner.name, err
                )
                continue
            self._feed(runner.name, readings)
            runner.first_attempt.set()  # readiness: the rack source has reported, shared


def _encode(r: Reading, now: float) -> dict[str, Any]:
    return {
        "source": r.source,
        "sensor": r.sensor,
        "kind": r.kind.value,
        "value": r.value,
        "unit": r.unit,
        "quality": r.quality.value,
        "age": max(0.0, now - r.mono),
        "wall": r.wall,
        "reason": r.reason,
        "device_ts": r.device_ts,
        "server_ts": r.server_ts,
        "labels": dict(r.labels),
    }


def _decode(d: dict[str, Any], published_mono: float) -> Reading:
    """A published reading, stamped on this host's clock: published time minus its age."""
    value = d["value"]
    return Reading(
        str(d["source"]),
        str(d["sensor"]),
        SensorKind(d["kind"]),
        None if value is None else float(value),
        str(d["unit"]),
        Quality(d["quality"]),
        published_mono - float(d["age"]),
        float(d["wall"]),
        reason=str(d.get("reason", "")),
        device_ts=d.get("device_ts"),
        labels={str(k): str(v) for k, v in (d.get("labels") or {}).items()},
        server_ts=d.get("server_ts"),
    )
