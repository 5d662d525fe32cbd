"""Safety limits: drain budgets, the storm breaker, staggered resumes, and operator overrides.

These limit *predictive* drains and *recovery*; a critical exclusion ignores
them (hardware safety first). What the cluster looks like (who is out of
service, recent trips and resumes) is an explicit input, :class:`ClusterView`:
replay builds it from the policy's own decisions with :class:`ClusterLedger`;
the daemon from the scheduler's state, or from its own ledger until it has one.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from policies.model import REASON_PREFIX, Action, Decision, FaultDomain
from policies.settings import PolicySettings

RACK_DOMAINS = frozenset({FaultDomain.RACK, FaultDomain.COOLING_LOOP})


class Pin(enum.StrEnum):
    """An operator's standing order for one node."""

    NEVER_DRAIN = "never_drain"  # rackguard takes no action on it (and resumes its own drain)
    EXCLUDED = "excluded"  # keep it excluded, whatever the evidence


@dataclass(frozen=True, slots=True)
class Overrides:
    """Operator input: pins, a pause of predictive drains, the storm breaker's reset."""

    pins: Mapping[str, Pin] = field(default_factory=lambda: MappingProxyType({}))
    predictive_paused: bool = False
    storm_reset_at: float | None = None  # monotonic time of the latest reset


@dataclass(frozen=True, slots=True)
class OutOfService:
    """A node rackguard has drained or excluded."""

    node: str
    rack: str
    action: Action
    domain: FaultDomain
    since: float
    following: str = ""  # the peer whose rack-level drain this node follows


@dataclass(frozen=True, slots=True)
class Event:
    """A drain/exclusion (a trip) or a resume of one node, at monotonic time ``at``."""

    node: str
    rack: str
    at: float
    critical: bool = False


@dataclass(frozen=True, slots=True)
class ClusterView:
    """What the policy knows about the cluster beyond one node."""

    racks: Mapping[str, tuple[str, ...]]
    out: Mapping[str, OutOfService] = field(default_factory=lambda: MappingProxyType({}))
    trips: tuple[Event, ...] = ()  # recent, oldest first
    resumes: tuple[Event, ...] = ()  # recent, oldest first
    total_nodes: int | None = None  # None: the nodes listed in ``racks``
    # Watts given up to rackguard's power caps on the other nodes (the fleet's, via
    # etcd; 0 elsewhere): counted against the cluster cap budget.
    capped_w: float = 0.0

    @property
    def cluster_size(self) -> int:
        """Nodes in the cluster."""
        if self.total_nodes is not None:
            return self.total_nodes
        return sum(len(n) for n in self.racks.values())


@dataclass(frozen=True, slots=True)
class BreakerState:
    """The storm breaker: open from ``open_since`` until an operator reset after it."""

    open_since: float | None = None
    trips: int = 0  # trips counted when it opened

    @property
    def open(self) -> bool:
        """Predictive drains are stopped."""
        return self.open_since is not None


# An exclusion's reason says so right after the tag: ``rackguard[gpu]: exclude: ...``.
# Slurm carries an exclusion out as a DRAIN by default (exclude_state = "drain"), so
# the node's state alone no longer tells other agents it was critical. After the
# tag, not inside it: agents of an older release still read the domain and ``ours``.
EXCLUDE_MARK = "exclude:"


def scheduler_reason(d: Decision) -> str:
    """The reason as the scheduler records it: the domain tagged, ``rackguard[cooling_loop]: ...``.

    An exclusion is marked after the tag (``rackguard[gpu]: exclude: ...``).
    Other agents read the domain (:func:`reason_domain`) and the action
    (:func:`reason_excludes`) back from the scheduler, to follow a rack-wide
    drain, to count budgets and to flag critical trips.
    """
    if d.action is Action.RESUME:
        return d.reason
    text = d.reason.removeprefix(REASON_PREFIX)
    if d.action is Action.EXCLUDE:
        text = f" {EXCLUDE_MARK}{text}"
    if d.domain is FaultDomain.NONE:
        return f"{REASON_PREFIX}{text}"
    return f"rackguard[{d.domain.value}]:{text}"


def reason_is_ours(reason: str) -> bool:
    """A hold with rackguard's reason: ``rackguard: ...`` or ``rackguard[<domain>]: ...``."""
    return _reason_text(reason) is not None


def reason_domain(reason: str) -> FaultDomain:
    """The domain a tagged reason names; NONE for the old untagged form or a foreign reason."""
    tag, sep, _ = reason.partition("]:")
    if sep and tag.startswith("rackguard[") and tag[10:] in _DOMAIN_VALUES:
        return FaultDomain(tag[10:])
    return FaultDomain.NONE


def reason_excludes(reason: str) -> bool:
    """True when rackguard's reason marks an exclusion (``rackguard[gpu]: exclude: ...``).

    Reasons written before the mark existed say nothing: False (the caller
    falls back on the node's state, DOWN being an exclusion).
    """
    text = _reason_text(reason)
    return text is not None and text.lstrip().startswith(EXCLUDE_MARK)


def _reason_text(reason: str) -> str | None:
    """What follows rackguard's prefix or tag; None for a reason that is not ours."""
    if reason.startswith(REASON_PREFIX):
        return reason.removeprefix(REASON_PREFIX)
    tag, sep, text = reason.partition("]:")
    if sep and tag.startswith("rackguard[") and tag[10:] in _DOMAIN_VALUES:
        return text
    return None


_DOMAIN_VALUES = frozenset(d.value for d in FaultDomain)


def budget(nodes: int, at_least: int, pct: float) -> int:
    """At most max(``at_least``, ``pct`` % of ``nodes``) nodes."""
    return max(at_least, math.floor(nodes * pct / 100.0))


def storm_threshold(view: ClusterView, s: PolicySettings) -> int:
    """Trips in the window above this open the breaker."""
    return budget(view.cluster_size, s.storm_trips, s.storm_pct)


def update_breaker(
    breaker: BreakerState, view: ClusterView, now: float, s: PolicySettings, o: Overrides
) -> BreakerState:
    """Open on a trip storm; stay open until a reset that comes after the opening."""
    reset = o.storm_reset_at
    if breaker.open:
        assert breaker.open_since is not None
        if reset is not None and reset >= breaker.open_since:
            return BreakerState()
        return breaker
    counted = [
        t for t in view.trips if now - t.at <= s.storm_window_s and (reset is None or t.at > reset)
    ]
    if len(counted) > storm_threshold(view, s):
        return BreakerState(now, len(counted))
    return breaker


def drain_withheld(
    node: str,
    rack: str,
    domain: FaultDomain,
    view: ClusterView,
    s: PolicySettings,
    breaker: BreakerState,
    o: Overrides,
) -> str:
    """Why a predictive drain of ``node`` may not happen now; "" when it may."""
    if o.predictive_paused:
        return "predictive drains paused by operator"
    if breaker.open:
        return f"storm breaker open ({breaker.trips} trips) until an operator reset"
    others = [oos for oos in view.out.values() if oos.node != node]
    cluster_cap = budget(view.cluster_size, s.cluster_budget_nodes, s.cluster_budget_pct)
    if len(others) >= cluster_cap:
        return f"cluster budget exhausted ({len(others)}/{cluster_cap} nodes out)"
    if domain not in RACK_DOMAINS:
        # A rack-wide cause takes the rack's nodes; the per-rack budget guards
        # against many independent node/GPU drains in one rack.
        rack_nodes = len(view.racks.get(rack, ())) or 1
        in_rack = sum(1 for oos in others if oos.rack == rack)
        rack_cap = budget(rack_nodes, s.rack_budget_nodes, s.rack_budget_pct)
        if in_rack >= rack_cap:
            return f"rack budget exhausted ({in_rack}/{rack_cap} nodes out in {rack})"
    return ""


def jitter_s(node: str, s: PolicySettings) -> float:
    """A node's own extra healthy delay: deterministic, spread over resume_jitter x resume_after."""
    return _jitter_fraction(node) * s.resume_jitter * s.resume_after_s


@functools.lru_cache(maxsize=4096)
def _jitter_fraction(node: str) -> float:
    """Where in [0, 1) a node's jitter falls: from its name (asked at every evaluation)."""
    digest = hashlib.sha256(node.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def resume_withheld(node: str, rack: str, now: float, view: ClusterView, s: PolicySettings) -> str:
    """Why ``node`` may not resume now (stagger); "" when it may."""
    recent = [
        r
        for r in view.resumes
        if r.rack == rack and r.node != node and now - r.at < s.resume_window_s
    ]
    if len(recent) >= s.resumes_per_window:
        return (
            f"staggered: {len(recent)} resume(s) in {rack} in the last "
            f"{s.resume_window_s:.0f}s (at most {s.resumes_per_window})"
        )
    return ""


@dataclass(eq=False)
class ClusterLedger:
    """Builds a ClusterView from decisions as they are made (replay; a lone daemon).

    Keeps the out-of-service set and the trips and resumes of the last ``horizon_s``.
    """

    racks: Mapping[str, tuple[str, ...]]
    horizon_s: float
    rack_of: dict[str, str] = field(init=False)
    out: dict[str, OutOfService] = field(init=False, default_factory=dict)
    trips: deque[Event] = field(init=False, default_factory=deque)
    resumes: deque[Event] = field(init=False, default_factory=deque)

    def __post_init__(self) -> None:
        self.racks = MappingProxyType(dict(self.racks))
        self.rack_of = {n: r for r, nodes in self.racks.items() for n in nodes}

    def record(
        self, d: Decision, now: float, *, critical: bool = False, following: str = ""
    ) -> None:
        """Account for one decision made at monotonic ``now``."""
        rack = self.rack_of.get(d.node, "")
        if d.action is Action.RESUME:
            self.out.pop(d.node, None)
            self.resumes.append(Event(d.node, rack, now))
            return
        prior = self.out.get(d.node)
        oos = OutOfService(d.node, rack, d.action, d.domain, now, following)
        if prior is not None:
            # An escalation (drain -> exclude) is not a new trip.
            self.out[d.node] = replace(oos, since=prior.since)
            return
        self.out[d.node] = oos
        self.trips.append(Event(d.node, rack, now, critical))

    def restore(self, node: str, action: Action, domain: FaultDomain, now: float) -> None:
        """Adopt a node taken out earlier (e.g. found so at start)."""
        if action is Action.RESUME:
            self.out.pop(node, None)
        else:
            rack = self.rack_of.get(node, "")
            self.out[node] = OutOfService(node, rack, action, domain, now)

    def view(self, now: float) -> ClusterView:
        """The view at ``now``; older trips and resumes are forgotten."""
        for events in (self.trips, self.resumes):
            while events and now - events[0].at > self.horizon_s:
                events.popleft()
        return ClusterView(
            self.racks, MappingProxyType(dict(self.out)), tuple(self.trips), tuple(self.resumes)
        )
