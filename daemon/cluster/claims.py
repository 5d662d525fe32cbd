"""Atomic fleet claims in etcd: drain slots, resume slots, the storm breaker, rack-wide causes.

Key layout under the prefix (default ``/rackguard/``)::

    drain/cluster/<i>        node   agent lease   one of the cluster budget's N slots
    drain/rack/<rack>/<j>    node   agent lease   a per-rack slot (node/GPU causes only)
    trip/<k>                 node   storm lease   one of the storm threshold's slots
    trip/cap/<node>          node   storm lease   a node newly power-capped (the cap storm)
    breaker                  JSON   no lease      open until an operator resets it
    resume/<rack>/<i>        node   window lease  resumes_per_window slots per window
    cause/<rack>/<node>      JSON   agent lease   a rack-wide cause: the rack follows it
    caps/<node>              JSON   agent lease   watts given up to rackguard's power caps

A slot is claimed in one transaction that compares every key it writes as
absent (and the breaker too): with every agent counting the same N slots, no
more than N are ever held. A slot bound to the agent's lease goes when the
agent dies; trips and resumes carry leases of the storm and stagger windows,
so they expire on their own.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import orjson

from daemon.cluster.etcd import (
    EtcdClient,
    EtcdError,
    Kv,
    absent,
    delete_op,
    put_op,
    range_op,
    ranges,
)
from daemon.cluster.etcd_values import Breaker, Values


@dataclass(frozen=True, slots=True)
class Grant:
    """A claim's answer: granted, or refused with why (words for the decision log)."""

    granted: bool
    why: str = ""


@dataclass(frozen=True, slots=True)
class Budgets:
    """The caps every agent must count alike (derived from the shared policy settings)."""

    cluster: int
    rack: int
    storm: int  # the breaker opens above this many trips in the storm window
    storm_window_s: float
    resumes_per_window: int
    resume_window_s: float


class Claims:
    """The claim protocol for one agent, bound to its lease."""

    ATTEMPTS = 5  # a lost race re-reads and tries again

    def __init__(
        self,
        client: EtcdClient,
        node: str,
        prefix: str = "/rackguard/",
        values: Values | None = None,
    ) -> None:
        self.etcd = client
        self.node = node
        self.p = prefix
        self.values = values or Values(node)
        self.lease = 0  # the agent's lease; set by the owner once granted
        # The owner's way to get a lease when none is held now (EtcdAgent.hold_lease).
        self.acquire: Callable[[], Awaitable[int]] | None = None

    def key(self, *parts: str) -> str:
        """A key under the prefix."""
        return self.p + "/".join(parts)

    async def _snapshot(self, *prefixes: str) -> list[list[Kv]]:
        """Several prefixes read at one revision (a txn of ranges)."""
        _, responses = await self.etcd.txn([], [range_op(self.p + x) for x in prefixes])
        out = ranges(responses)
        if len(out) != len(prefixes):
            raise EtcdError(f"txn of {len(prefixes)} ranges answered {len(out)}")
        return out

    async def claim_drain(self, rack: str, rack_wide: bool, b: Budgets, cause: str = "") -> Grant:
        """A predictive drain's slot (and its trip); refused when the budget or storm is full.

        ``cause``: the rack-wide domain this node leads with; its cause key is written
        in the same transaction, so the rack sees slot and cause together.
        """
        lease = await self._leased()
        for _ in range(self.ATTEMPTS):
            drains, trips, breaker = await self._snapshot("drain/", "trip/", "breaker")
            if breaker:
                words = self._breaker_words(breaker[0])
                return Grant(False, f"storm breaker open fleet-wide ({words})")
            cluster = self._slots(drains, self.key("drain", "cluster", ""))
            in_rack = self._slots(drains, self.key("drain", "rack", rack, ""))
            if self.node in cluster.values():
                return Grant(True)  # already holds one (a retried or repeated claim)
            free = _free(cluster, b.cluster)
            if free is None:
                return Grant(
                    False, f"cluster budget exhausted ({len(cluster)}/{b.cluster} claimed)"
                )
            compare = [absent(self.key("breaker")), absent(self.key("drain", "cluster", free))]
            ops = [put_op(self.key("drain", "cluster", free), self.node, lease)]
            if not rack_wide:
                slot = _free(in_rack, b.rack)
                if slot is None:
                    return Grant(
                        False, f"rack budget exhausted ({len(in_rack)}/{b.rack} claimed in {rack})"
                    )
                compare.append(absent(self.key("drain", "rack", rack, slot)))
                ops.append(put_op(self.key("drain", "rack", rack, slot), self.node, lease))
            trip = _free(self._slots(trips, self.key("trip", "")), b.storm + 1)
            if trip is None:
                await self.open_breaker(len(trips))
                return Grant(False, f"storm breaker opened ({len(trips)} trips in the window)")
            trip_lease = await self.etcd.grant(math.ceil(b.storm_window_s))
            compare.append(absent(self.key("trip", trip)))
            ops.append(put_op(self.key("trip", trip), self.node, trip_lease))
            if cause:
                body = orjson.dumps({"domain": cause})
                ops.append(put_op(self.key("cause", rack, self.node), body, lease))
            ok, _ = await self.etcd.txn(compare, ops)
            if ok:
                return Grant(True)
            await self.etcd.revoke(trip_lease)
        return Grant(False, "drain claim lost the race repeatedly; trying again later")

    async def claim_resume(self, rack: str, b: Budgets) -> Grant:
        """A resume slot in the rack's stagger window; taking it frees this node's drain slots."""
        for _ in range(self.ATTEMPTS):
            resumes, drains = await self._snapshot(f"resume/{rack}/", "drain/")
            held = self._slots(resumes, self.key("resume", rack, ""))
            release = [delete_op(kv.key) for kv in drains if kv.value == self.node.encode()]
            release.append(delete_op(self.key("cause", rack, self.node)))
            if self.node in held.values():
                await self.etcd.txn([], release)
                return Grant(True)
            slot = _free(held, b.resumes_per_window)
            if slot is None:
                return Grant(
                    False,
                    f"staggered fleet-wide: {len(held)} resume(s) in {rack} in the last "
                    f"{b.resume_window_s:.0f}s (at most {b.resumes_per_window})",
                )
            lease = await self.etcd.grant(math.ceil(b.resume_window_s))
            key = self.key("resume", rack, slot)
            ok, _ = await self.etcd.txn([absent(key)], [put_op(key, self.node, lease), *release])
            if ok:
                return Grant(True)
            await self.etcd.revoke(lease)
        return Grant(False, "staggered: resume claim lost the race repeatedly; trying again later")

    async def record_trip(self, b: Budgets) -> None:
        """A critical exclusion counts toward the storm, unclaimed (it never waits)."""
        lease = await self.etcd.grant(math.ceil(b.storm_window_s))
        await self.etcd.put(self.key("trip", f"critical-{self.node}-{lease}"), self.node, lease)

    async def put_caps(self, watts: float) -> None:
        """This node's capped watts, for the cluster cap budget (none: the key goes)."""
        key = self.key("caps", self.node)
        if watts <= 0.0:
            await self.etcd.txn([], [delete_op(key)])
            return
        await self.etcd.put(key, orjson.dumps({"watts": round(watts, 1)}), await self._leased())

    async def record_cap(self, storm_nodes: int, window_s: float) -> None:
        """This node newly capped: counted once per window toward the fleet's cap storm,
        after the fact (a cap never waits); above ``storm_nodes`` nodes the storm breaker
        opens, for drains and caps alike."""
        lease = await self.etcd.grant(math.ceil(window_s))
        key = self.key("trip", "cap", self.node)
        ok, _ = await self.etcd.txn([absent(key)], [put_op(key, self.node, lease)])
        if not ok:
            await self.etcd.revoke(lease)  # already counted in this window
        (capped,) = await self._snapshot("trip/cap/")
        if len(capped) > storm_nodes:
            await self.open_breaker(len(capped))

    async def open_breaker(self, trips: int) -> None:
        """Open the fleet's storm breaker (once: the first writer's words stay)."""
        body = orjson.dumps({"trips": trips, "by": self.node})
        key = self.key("breaker")
        await self.etcd.txn([absent(key)], [put_op(key, body)])

    async def reset_breaker(self) -> None:
        """An operator's reset: the breaker and the counted trips go."""
        await self.etcd.txn(
            [], [delete_op(self.key("breaker")), delete_op(self.key("trip", ""), prefix=True)]
        )

    async def put_cause(self, rack: str, domain: str) -> None:
        """This node is out for a rack-wide cause: its rack peers follow at once."""
        body = orjson.dumps({"domain": domain})
        await self.etcd.put(self.key("cause", rack, self.node), body, await self._leased())

    async def _leased(self) -> int:
        # A slot or cause written without the lease would outlive this agent.
        if self.acquire is not None:
            return await self.acquire()
        if self.lease == 0:
            raise EtcdError("no etcd lease held now")
        return self.lease

    def _slots(self, kvs: list[Kv], under: str) -> dict[str, str]:
        """Slot index -> holder, for the keys directly under ``under``.

        A slot holding junk is still taken (its key exists: no claim can write
        it) but names nobody ("").
        """
        out = {}
        for kv in kvs:
            rest = kv.key.removeprefix(under)
            if kv.key.startswith(under) and "/" not in rest:
                out[rest] = self.values.node_name(kv, "slot") or ""
        return out

    def _breaker_words(self, kv: Kv) -> str:
        body = self.values.decode(kv, Breaker, "breaker")
        return "opened" if body is None else f"{body.trips} trips, opened by {body.by}"


def _free(held: dict[str, str], cap: int) -> str | None:
    """The lowest free slot of ``cap`` (None when as many are held as the cap allows)."""
    if len(held) >= cap:
        return None
    return next((str(i) for i in range(cap) if str(i) not in held), None)
