"""The cluster view from the scheduler, at a cost to the controller bounded by design.

Without etcd each agent reads every node, every ``view_interval_s`` or every
``fleet size / view_budget_reads_per_s`` seconds, whichever is longer, so the
whole fleet's full reads stay within the budget however large it grows. With
etcd one agent reads for the cluster every ``view_interval_s`` and publishes
the view; the rest take it from their watch (daemon/cluster/shared_view.py) and
read the scheduler themselves, on the budget, only while no fresh view is published.

Nodes held with rackguard's reason are out of service (the domain from the
reason's tag, an exclusion from the mark after it or a DOWN state, since when
from the scheduler's reason time); a node newly seen held is a trip (critical
for an exclusion), one no longer held a resume. Eventually consistent: agents
deciding within one interval of each other do not see each other's drains, so
a budget can be overshot by the drains made in one interval (docs/fleet.md).
"""

from __future__ import annotations

import logging
import random
import re
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from adapters.schedulers.base import NodeReadError
from adapters.schedulers.listing import FollowingLister, ListedNode, NodeLister
from daemon.cluster.shared_view import SharedView
from daemon.poller import Health, Poller
from policies.model import Action
from policies.safety import ClusterView, Event, OutOfService, reason_domain, reason_excludes

log = logging.getLogger(__name__)

_FOLLOWING = re.compile(r"\(following ([^)\s]+)\)")


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One read of the scheduler, turned into the policy's terms."""

    racks: Mapping[str, tuple[str, ...]]
    out: Mapping[str, OutOfService]
    total: int


class SchedulerView:
    """Reads all nodes on a cadence (or takes the shared view); ``view(now)`` is the latest."""

    def __init__(
        self,
        lister: NodeLister,
        *,
        interval_s: float,
        horizon_s: float,
        racks: Mapping[str, str] | None = None,  # node -> rack from the config
        rng: random.Random | None = None,
        budget_reads_per_s: float = 0.5,
        shared: SharedView | None = None,
    ) -> None:
        self.lister = lister
        self.interval_s = interval_s
        self.budget_reads_per_s = budget_reads_per_s
        self.shared = shared
        self.horizon_s = horizon_s
        self.config_racks = dict(racks or {})
        self._rng = rng or random.Random()
        self.snapshot: Snapshot | None = None
        self.trips: deque[Event] = deque()
        self.resumes: deque[Event] = deque()
        self.read_at: float | None = None  # monotonic time of the last good read
        self.reads = 0  # full reads of the scheduler made by this agent (a metric)
        self._taken: tuple[int, int] | None = None  # the shared view's revisions taken
        self._last_error = ""
        self._waiting: float | None = None  # since when a shared view is awaited
        # The first read falls anywhere in the first interval: a fleet started at once
        # spreads out. Then reads are due on the budget, each step jittered by 10 %.
        self._due = time.monotonic() + self._rng.uniform(0, interval_s)
        # A tick is cheap (a read only when one is due, the shared view a mirror look-up):
        # every quarter interval, or sooner when a read falls due before.
        self.poller = Poller(
            "cluster view",
            self._tick,
            interval_s=lambda: max(0.01, min(interval_s / 4, self._due - time.monotonic())),
            failures=(NodeReadError,),
            on_change=self._changed,
            wake=shared.agent.changed if shared is not None else None,
            rng=self._rng,
        )

    def budget_interval(self, size: int | None = None) -> float:
        """Seconds between this agent's own full reads: the fleet shares the budget."""
        n = size if size is not None else (self.snapshot.total if self.snapshot else 1)
        return max(self.interval_s, n / self.budget_reads_per_s)

    @property
    def healthy(self) -> bool:
        """The last read succeeded."""
        return self.poller.health is Health.UP

    @property
    def failures(self) -> int:
        """Reads that failed, in all."""
        return self.poller.stats.failures

    def absorb(self, nodes: list[ListedNode], now: float, wall: float) -> None:
        """Take one listing read at monotonic ``now`` / wall ``wall``."""
        racks, out = self._digest(nodes, now, wall)
        self._take(racks, out, len(nodes), now)

    def _digest(
        self, nodes: list[ListedNode], now: float, wall: float
    ) -> tuple[dict[str, list[str]], dict[str, OutOfService]]:
        racks: dict[str, list[str]] = {}
        out: dict[str, OutOfService] = {}
        for n in nodes:
            v = n.view
            if not v.node:
                continue
            rack = n.rack or self.config_racks.get(v.node, "")
            racks.setdefault(rack, []).append(v.node)
            if not (v.held and v.ours):
                continue
            since = now - max(0.0, wall - n.reason_at) if n.reason_at is not None else now
            prior = self.snapshot.out.get(v.node) if self.snapshot else None
            if prior is not None and n.reason_at is None:
                since = prior.since  # the scheduler keeps no time: when we first saw it
            m = _FOLLOWING.search(v.reason)
            # An exclusion carried out as a drain (exclude_state = "drain", the default:
            # Slurm DRAIN, Kubernetes NoSchedule) says so in its reason; DOWN (or
            # NoExecute) is one whatever the reason.
            action = Action.EXCLUDE if v.down or reason_excludes(v.reason) else Action.DRAIN
            out[v.node] = OutOfService(
                v.node, rack, action, reason_domain(v.reason), since, m.group(1) if m else ""
            )
        return racks, out

    def _take(
        self,
        racks: Mapping[str, list[str]],
        out: Mapping[str, OutOfService],
        total: int,
        now: float,
    ) -> None:
        """A new view (read here or published): trips and resumes are its changes."""
        before = self.snapshot.out if self.snapshot else {}
        first = self.snapshot is None
        for name, oos in out.items():
            if name not in before and (not first or now - oos.since <= self.horizon_s):
                self.trips.append(Event(name, oos.rack, oos.since, oos.action is Action.EXCLUDE))
        for name, oos in before.items():
            if name not in out:
                self.resumes.append(Event(name, oos.rack, now))
        self.snapshot = Snapshot(
            MappingProxyType({r: tuple(sorted(ns)) for r, ns in racks.items()}),
            MappingProxyType(dict(out)),
            total,
        )

    def view(self, now: float) -> ClusterView | None:
        """The view at ``now``; None before the first good read."""
        if self.snapshot is None:
            return None
        for events in (self.trips, self.resumes):
            while events and now - events[0].at > self.horizon_s:
                events.popleft()
        s = self.snapshot
        trips = tuple(sorted(self.trips, key=lambda e: e.at))
        return ClusterView(s.racks, s.out, trips, tuple(self.resumes), total_nodes=s.total)

    async def read_once(self) -> None:
        """One read now; a failure keeps the last view and is logged on the transition only."""
        self._due = time.monotonic()
        await self.poller.attempt()

    async def _tick(self) -> None:
        now = time.monotonic()
        shared = self.shared
        reading = False
        if shared is not None and not shared.active and shared.agent.failures == 0:
            return  # etcd not tried yet: its view, not a read of our own, comes first
        if shared is not None and shared.active:
            reading = await shared.elect()
            self._follow(reading)
            if not reading:
                pub = shared.latest(now, time.time())
                if pub is not None and pub.age_s <= self._stale_s():
                    if pub.revision != self._taken:
                        self._taken = pub.revision
                        self._take(pub.racks, pub.out, pub.total, now)
                    self.read_at = now - pub.age_s
                    self._last_error = ""
                    self._waiting = None
                    if self._due <= now:
                        # Should the shared view go, the agents' own reads fall anywhere
                        # in one budgeted interval: the budget holds from the first.
                        self._due = now + self._rng.uniform(0, self.budget_interval())
                    return
                # Another agent won the election (its key may not be mirrored yet) but
                # has published nothing fresh: wait as long as a view may be old, then
                # read on the budget.
                self._waiting = now if self._waiting is None else self._waiting
                if now - self._waiting < self._stale_s():
                    return
        self._follow(reading)
        if reading and self._due - now > self.interval_s:
            self._due = now  # just elected: read now, not on a follower's budget
        if now < self._due:
            if self._last_error:
                raise NodeReadError(self._last_error)  # still DOWN until the next due read
            return
        # The cluster's one reader reads at least every interval (a drain is seen within
        # one); each agent on the budget jitters by 10 % either way, to spread them out.
        jitter = self._rng.uniform(0.8, 1.0) if reading else self._rng.uniform(0.9, 1.1)
        step = self.interval_s if reading else self.budget_interval()
        self._due = now + step * jitter  # a failure waits as long
        await self._read(shared if reading else None)
        if not reading:  # the budget for the size just read
            self._due = now + self.budget_interval() * self._rng.uniform(0.9, 1.1)

    def _follow(self, reading: bool) -> None:
        """Only the cluster's one reader keeps a watch (Kubernetes): a watch per agent would
        send every node's every change to every agent (docs/fleet.md)."""
        if isinstance(self.lister, FollowingLister):
            self.lister.follow(reading)

    def _stale_s(self) -> float:
        """A published view older than this is not taken (its reader is stuck)."""
        lease = self.shared.agent.lease_ttl_s if self.shared is not None else 0
        return 3 * self.interval_s + lease

    async def _read(self, publish: SharedView | None = None) -> None:
        try:
            nodes = await self.lister.list_nodes()
        except NodeReadError as err:
            self._last_error = str(err)
            raise
        self._last_error = ""
        if publish is None or not isinstance(self.lister, FollowingLister):
            self.reads += 1  # the reader's watch is no read of the scheduler
        self.read_at = time.monotonic()
        wall = time.time()
        racks, out = self._digest(nodes, self.read_at, wall)
        self._take(racks, out, len(nodes), self.read_at)
        if publish is not None:
            await publish.publish(racks, list(out.values()), self.read_at, wall)

    def _changed(self, old: Health, new: Health, message: str) -> None:
        if new is not Health.UP:
            log.warning("cluster view: scheduler not readable, keeping the last view: %s", message)
        elif old is not Health.STARTING:
            total = self.snapshot.total if self.snapshot else 0
            log.info("cluster view: scheduler readable again (%d nodes)", total)

    async def run(self) -> None:
        """Read every ``interval_s`` until cancelled."""
        await self.poller.run()
