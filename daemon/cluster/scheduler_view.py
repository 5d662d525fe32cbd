"""The cluster view from the scheduler: every node read every ``view_interval_s``.

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
from adapters.schedulers.listing import ListedNode, NodeLister
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
    """Reads all nodes on a cadence; ``view(now)`` is the latest ClusterView."""

    def __init__(
        self,
        lister: NodeLister,
        *,
        interval_s: float,
        horizon_s: float,
        racks: Mapping[str, str] | None = None,  # node -> rack from the config
        rng: random.Random | None = None,
    ) -> None:
        self.lister = lister
        self.interval_s = interval_s
        self.horizon_s = horizon_s
        self.config_racks = dict(racks or {})
        self._rng = rng or random.Random()
        self.snapshot: Snapshot | None = None
        self.trips: deque[Event] = deque()
        self.resumes: deque[Event] = deque()
        self.read_at: float | None = None  # monotonic time of the last good read
        # Every interval_s, each step jittered by up to 10 %, so agents spread out.
        self.poller = Poller(
            "cluster view",
            self._read,
            interval_s=interval_s,
            failures=(NodeReadError,),
            step_jitter=0.1,
            on_change=self._changed,
            rng=self._rng,
        )

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
            MappingProxyType(out),
            len(nodes),
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
        """One read; a failure keeps the last view and is logged on the transition only."""
        await self.poller.attempt()

    async def _read(self) -> None:
        nodes = await self.lister.list_nodes()
        self.read_at = time.monotonic()
        self.absorb(nodes, self.read_at, time.time())

    def _changed(self, old: Health, new: Health, message: str) -> None:
        if new is not Health.UP:
            log.warning("cluster view: scheduler not readable, keeping the last view: %s", message)
        elif old is not Health.STARTING:
            total = self.snapshot.total if self.snapshot else 0
            log.info("cluster view: scheduler readable again (%d nodes)", total)

    async def run(self) -> None:
        """Read every ``interval_s`` until cancelled."""
        await self.poller.run()
