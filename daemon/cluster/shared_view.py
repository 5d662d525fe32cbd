"""One scheduler reader per cluster: with etcd, the view is read once and watched by all.

The agents race for ``viewer`` (``EtcdAgent.stand``, as ``leader/<rack>``: bound
to the winner's lease, taken for this; a follower holds none);
the holder reads every node from the scheduler every ``view_interval_s`` and
publishes the view: ``view/racks`` (membership, written when it changes),
``view/out`` (the nodes out of service, when they change) and ``view/at`` (the
read's wall time, every read), all under its lease. Every agent already
mirrors the prefix through its one watch, so the others read no scheduler at
all: the controller serves one full read per interval for the whole cluster.

Everything read back is decoded through the models below; a value that does
not decode, or that was not published by the current ``viewer``, is not a view.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import msgspec

from daemon.cluster.agent import EtcdAgent
from daemon.cluster.etcd import EtcdError, Kv
from daemon.cluster.etcd_values import NODE_NAME
from policies.model import Action, FaultDomain
from policies.safety import OutOfService

log = logging.getLogger(__name__)


class _Out(msgspec.Struct, array_like=True, frozen=True):
    node: str
    rack: str
    action: Action
    domain: FaultDomain
    since: float  # wall time
    following: str = ""


class _OutBody(msgspec.Struct, frozen=True):
    by: str
    out: list[_Out]


class _RacksBody(msgspec.Struct, frozen=True):
    by: str
    racks: dict[str, list[str]]


class _AtBody(msgspec.Struct, frozen=True):
    by: str
    at: float  # wall time of the read


@dataclass(frozen=True, slots=True)
class Published:
    """A view as the reader published it; ``out`` with ``since`` on the caller's clock."""

    racks: dict[str, list[str]]
    out: dict[str, OutOfService]
    total: int
    revision: tuple[int, int]  # mod revisions of view/racks and view/out
    age_s: float  # since the read, by the publisher's wall clock


class SharedView:
    """Elects the cluster's reader, publishes its reads, decodes the reader's view for the rest."""

    def __init__(self, agent: EtcdAgent) -> None:
        self.agent = agent
        self.reading = False
        self.rejected = 0  # published values that did not decode (a metric)
        self._sent: dict[str, bytes] = {}  # key -> last value this agent put
        self._bad: set[int] = set()  # mod revisions already logged as undecodable
        # The last decoded view, by (holder, racks revision, out revision): an agent
        # ticks at every change etcd mirrors, and 10,000 nodes' membership is ~100 KB.
        self._decoded: tuple[tuple[str, int, int], Published | None] | None = None
        self.fleet_size = 1  # nodes in the last view published or taken (1: none yet)

    @property
    def active(self) -> bool:
        """etcd is up: the shared view is in use (a follower holds no lease to watch it)."""
        return self.agent.up

    @property
    def reader(self) -> str:
        """Who reads for the cluster ("" when nobody, or a value that is not a node name)."""
        kv = self.agent.get("viewer")
        return (self.agent.values.node_name(kv, "viewer") or "") if kv is not None else ""

    async def elect(self) -> bool:
        """True when this agent is (or has just become) the cluster's reader."""
        was = self.reading
        # The whole fleet may stand: spread over its size (the last view's), not a rack's.
        self.reading = await self.agent.stand("viewer", candidates=self.fleet_size)
        if self.reading != was:
            self._sent.clear()  # a new term: publish everything afresh
            log.info(
                "%s: %s the scheduler view for the cluster",
                self.agent.node,
                "reading" if self.reading else f"following {self.reader or 'nobody'} for",
            )
        return self.reading

    async def publish(
        self,
        racks: dict[str, list[str]],
        out: list[OutOfService],
        now: float,
        wall: float,
    ) -> None:
        """Put this read's view: membership and the out-of-service set when changed, its time."""
        me = self.agent.node
        self.fleet_size = max(1, sum(map(len, racks.values())))
        rows = [
            _Out(o.node, o.rack, o.action, o.domain, wall - max(0.0, now - o.since), o.following)
            for o in sorted(out, key=lambda o: o.node)
        ]
        values = {
            "racks": msgspec.json.encode(_RacksBody(me, racks)),
            "out": msgspec.json.encode(_OutBody(me, rows)),
            "at": msgspec.json.encode(_AtBody(me, wall)),
        }
        lease = self.agent.claims.lease
        if not self.reading or lease == 0:
            return  # between leases: a view without one would outlive its reader
        try:
            for name, value in values.items():
                if name != "at" and self._sent.get(name) == value:
                    continue
                await self.agent.etcd.put(self.agent.claims.key("view", name), value, lease)
                self._sent[name] = value
        except EtcdError as err:
            self.agent.mark_down(err)

    def latest(self, now: float, wall: float) -> Published | None:
        """The reader's view from the mirror, or None (none yet, not the reader's, undecodable)."""
        holder = self.reader
        kvs = [self.agent.get("view", name) for name in ("racks", "out", "at")]
        if not holder or any(kv is None for kv in kvs):
            return None
        k_racks, k_out, k_at = kvs
        assert k_racks is not None and k_out is not None and k_at is not None
        try:
            at = msgspec.json.decode(k_at.value, type=_AtBody)
        except (msgspec.ValidationError, msgspec.DecodeError) as err:
            self._reject(k_at, str(err))
            return None
        if at.by != holder:
            return None
        cache_key = (holder, k_racks.mod_revision, k_out.mod_revision)
        if self._decoded is None or self._decoded[0] != cache_key:
            self._decoded = (cache_key, self._decode(holder, k_racks, k_out, now, wall))
            if self._decoded[1] is not None:
                self.fleet_size = max(1, self._decoded[1].total)
        view = self._decoded[1]
        return None if view is None else replace(view, age_s=wall - at.at)

    def _reject(self, kv: Kv, why: str) -> None:
        """Counted here and in rackguard_etcd_bad_values{kind="view"}, logged once."""
        if kv.mod_revision not in self._bad:
            self._bad.add(kv.mod_revision)
            self.rejected += 1
        self.agent.values.bad_value(kv, "view", why)

    def _decode(
        self, holder: str, k_racks: Kv, k_out: Kv, now: float, wall: float
    ) -> Published | None:
        try:
            racks = msgspec.json.decode(k_racks.value, type=_RacksBody)
        except (msgspec.ValidationError, msgspec.DecodeError) as err:
            self._reject(k_racks, str(err))
            return None
        try:
            out = msgspec.json.decode(k_out.value, type=_OutBody)
        except (msgspec.ValidationError, msgspec.DecodeError) as err:
            self._reject(k_out, str(err))
            return None
        names = [n for ns in racks.racks.values() for n in ns] + [o.node for o in out.out]
        if any(NODE_NAME.fullmatch(n) is None for n in names):
            self._reject(k_out, "not a node name in the view")
            return None
        if {racks.by, out.by} != {holder}:
            return None  # left over from a former reader, or forged by another agent
        rack_of = {n: r for r, ns in racks.racks.items() for n in ns}
        held = {
            o.node: OutOfService(
                o.node,
                rack_of.get(o.node, o.rack),
                o.action,
                o.domain,
                now - max(0.0, wall - o.since),
                o.following,
            )
            for o in out.out
            if o.node in rack_of  # counts only nodes the cluster has
        }
        return Published(
            racks.racks, held, len(rack_of), (k_racks.mod_revision, k_out.mod_revision), 0.0
        )
