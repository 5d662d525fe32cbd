"""The fleet as the policy sees it: one ClusterView, and claims made before predictive actions.

Modes (docs/fleet.md):

* lone: the agent's own ledger (no scheduler listing, no etcd) -- as before;
* scheduler view: every node read every ``view_interval_s`` -- eventually consistent;
* etcd: the scheduler view for who is out, plus atomic claims for predictive
  drains, resumes and the storm breaker, and rack-wide causes seen at once.
  With etcd unreachable it degrades to the scheduler view.

Power caps (policies/power_cap.py) with etcd: each agent publishes its node's capped
watts (``caps/<node>``); the others' sum is the view's ``capped_w``, counted against
the cluster cap budget. A node newly capped counts toward the cap storm, which opens
the fleet's storm breaker above the ladder's ``storm_nodes``.

Critical exclusions are never held back: they are recorded (trip, cause) off the
decision path, after the fact.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from dataclasses import replace
from types import MappingProxyType

from msgspec import UNSET

from adapters.timeouts import time_limit
from daemon.cluster.agent import EtcdAgent
from daemon.cluster.claims import Budgets, Grant
from daemon.cluster.etcd import EtcdError
from daemon.cluster.etcd_values import Breaker, Caps, Cause
from daemon.cluster.scheduler_view import SchedulerView
from daemon.cluster.status import ClusterStatus, EtcdStatus, SchedulerViewStatus
from policies.model import Action, FaultDomain
from policies.policy import Outcome
from policies.power_cap import CapLadder
from policies.safety import (
    RACK_DOMAINS,
    BreakerState,
    ClusterView,
    Event,
    OutOfService,
    budget,
    storm_threshold,
)
from policies.settings import PolicySettings

log = logging.getLogger(__name__)


class Fleet:
    """Merges this agent's ledger with the fleet's view, and gates predictive actions on claims."""

    def __init__(
        self,
        node: str,
        rack: str,
        settings: Callable[[], PolicySettings],
        *,
        scheduler: SchedulerView | None = None,
        etcd: EtcdAgent | None = None,
        claim_timeout_s: float = 1.0,
    ) -> None:
        self.node = node
        self.rack = rack
        self._settings = settings
        self.scheduler = scheduler
        self.etcd = etcd
        self.claim_timeout_s = claim_timeout_s
        self.claims_granted = 0
        self.claims_refused = 0
        self._last_size = 1
        self._last_rack_size = 1
        self.caps: CapLadder | None = None  # this node's cap rung, where [power_cap] is on
        self._caps_sent: tuple[float, float] | None = None  # (watts, monotonic) submitted
        self._capped = False  # this node under a cap of rackguard's at the last view

    @property
    def mode(self) -> str:
        """lone, scheduler or etcd."""
        return "etcd" if self.etcd else "scheduler" if self.scheduler else "lone"

    @property
    def degraded(self) -> bool:
        """Configured coordination is not working now (etcd away, or the scheduler unread)."""
        if self.etcd is not None and not self.etcd.up:
            return True
        s = self.scheduler
        return s is not None and s.failures > 0 and not s.healthy  # not before the first try

    def status(self) -> ClusterStatus:
        """For /readyz."""
        s, e = self.scheduler, self.etcd
        view = UNSET if s is None else SchedulerViewStatus(
            s.healthy, s.snapshot.total if s.snapshot else None
        )  # fmt: skip
        etcd = UNSET if e is None else EtcdStatus(
            e.up, e.failures, e.last_error if not e.up and e.last_error else UNSET
        )  # fmt: skip
        return ClusterStatus(self.mode, self.degraded, view, etcd)

    # -- the view --------------------------------------------------------------------

    def view(self, local: ClusterView, now: float) -> ClusterView:
        """The fleet's view with this node's own latest state from ``local`` (its ledger)."""
        base = self.scheduler.view(now) if self.scheduler is not None else None
        base = local if base is None else _with_own(base, local, self.node, self.rack)
        self._last_size = base.cluster_size
        self._last_rack_size = len(base.racks.get(self.rack, ())) or 1
        if self.etcd is None or not self.etcd.up:
            return base
        out = dict(base.out)
        values = self.etcd.values
        for kv in self.etcd.under("cause", ""):
            parts = kv.key.removeprefix(self.etcd.claims.key("cause", "")).split("/")
            if len(parts) != 2 or parts[1] == self.node or parts[1] in out:
                continue
            cause = values.decode(kv, Cause, "cause")
            if cause is None or not all(values.key_part(kv, p, "cause") for p in parts):
                continue
            try:
                domain = FaultDomain(cause.domain)
            except ValueError:
                values.bad_value(kv, "cause", f"no such fault domain {cause.domain[:64]!r}")
                continue
            since = self.etcd.seen_at.get(kv.key, now)
            out[parts[1]] = OutOfService(parts[1], parts[0], Action.DRAIN, domain, since)
        rack_of = {}
        for kv in self.etcd.under("drain", "rack", ""):
            parts = kv.key.removeprefix(self.etcd.claims.key("drain", "rack", "")).split("/")
            holder = values.node_name(kv, "slot")
            if holder is not None and values.key_part(kv, parts[0], "slot"):
                rack_of[holder] = parts[0]
        for kv in self.etcd.under("drain", "cluster", ""):
            holder = values.node_name(kv, "slot")
            if holder is not None and holder not in out and holder != self.node:
                since = self.etcd.seen_at.get(kv.key, now)
                rack = rack_of.get(holder, "")
                out[holder] = OutOfService(holder, rack, Action.DRAIN, FaultDomain.NONE, since)
        # Resume slots held now are recent resumes: a waiting node withholds on its own.
        resumes = list(base.resumes)
        for kv in self.etcd.under("resume", ""):
            holder = values.node_name(kv, "slot")
            rack = kv.key.removeprefix(self.etcd.claims.key("resume", "")).split("/")[0]
            if holder is None or holder == self.node:
                continue
            if all(r.node != holder for r in base.resumes):
                resumes.append(Event(holder, rack, self.etcd.seen_at.get(kv.key, now)))
        # The storm is counted in etcd (trip slots, the breaker key): no local trips.
        return replace(
            base,
            out=MappingProxyType(out),
            trips=(),
            resumes=tuple(resumes),
            capped_w=self._fleet_caps(self.etcd, now),
        )

    def _fleet_caps(self, agent: EtcdAgent, now: float) -> float:
        """The other nodes' capped watts; this node's own published when it changed."""
        others, mine = 0.0, 0.0
        under = agent.claims.key("caps", "")
        for kv in agent.under("caps", ""):
            holder = agent.values.key_part(kv, kv.key.removeprefix(under), "caps")
            body = agent.values.decode(kv, Caps, "caps")
            if holder is None or body is None:
                continue
            if not math.isfinite(body.watts) or body.watts < 0.0:
                agent.values.bad_value(kv, "caps", f"not a wattage: {body.watts!r}")
                continue
            if holder == self.node:
                mine = body.watts
            else:
                others += body.watts
        if self.caps is not None:
            self._publish_caps(agent, mine, now)
        return others

    def _publish_caps(self, agent: EtcdAgent, shown: float, now: float) -> None:
        assert self.caps is not None
        watts = round(self.caps.capped_w(self.node), 1)
        capped = watts > 0.0
        if capped and not self._capped:
            c = self.caps.settings
            agent.submit(lambda: _quiet(agent.claims.record_cap(c.storm_nodes, c.storm_window_s)))
        self._capped = capped
        if abs(watts - shown) < 1.0:
            return
        sent = self._caps_sent
        if sent is not None and abs(sent[0] - watts) < 1.0 and now - sent[1] < _RESEND_S:
            return  # submitted, not yet mirrored back
        self._caps_sent = (watts, now)
        agent.submit(lambda: _quiet(agent.claims.put_caps(watts)))

    def breaker(self, current: BreakerState, now: float) -> BreakerState:
        """With etcd up, the breaker is the fleet's key; otherwise this agent's own."""
        if self.etcd is None or not self.etcd.up:
            return current
        kv = self.etcd.get("breaker")
        if kv is None:
            return BreakerState() if current.open else current
        if current.open:
            return current
        body = self.etcd.values.decode(kv, Breaker, "breaker")
        trips = body.trips if body is not None else 0  # open all the same: its key is there
        return BreakerState(self.etcd.seen_at.get(kv.key, now), trips)

    def reset_storm(self) -> None:
        """An operator reset through this agent's API resets the fleet's breaker."""
        if self.etcd is not None:
            self.etcd.submit(self.etcd.claims.reset_breaker)

    # -- claims ------------------------------------------------------------------------

    def budgets(self, s: PolicySettings) -> Budgets:
        """The caps, from the shared settings and the cluster's size."""
        size = self._last_size
        view = ClusterView(racks={}, total_nodes=size)
        return Budgets(
            cluster=budget(size, s.cluster_budget_nodes, s.cluster_budget_pct),
            rack=budget(self._last_rack_size, s.rack_budget_nodes, s.rack_budget_pct),
            storm=storm_threshold(view, s),
            storm_window_s=s.storm_window_s,
            resumes_per_window=s.resumes_per_window,
            resume_window_s=s.resume_window_s,
        )

    async def admit(self, outcome: Outcome) -> str:
        """Claim what a decision needs before it is made; why not, or "" to go ahead."""
        d = outcome.decision
        agent = self.etcd
        if d is None or d.dry_run or agent is None:
            return ""
        rack_wide = d.domain in RACK_DOMAINS
        if outcome.critical or d.action is Action.EXCLUDE:
            # Hardware first: made now, counted after the fact.
            b = self.budgets(self._settings())
            agent.submit(lambda: _quiet(agent.claims.record_trip(b)))
            if rack_wide and not outcome.following:
                agent.submit(lambda: _quiet(agent.claims.put_cause(self.rack, d.domain.value)))
            return ""
        if not agent.up:
            return ""  # degraded: the policy already gated on the scheduler view
        b = self.budgets(self._settings())
        try:
            async with time_limit(self.claim_timeout_s):
                if d.action is Action.DRAIN:
                    lead = rack_wide and not outcome.following
                    cause = d.domain.value if lead else ""
                    grant = await agent.claims.claim_drain(self.rack, rack_wide, b, cause)
                else:
                    grant = await agent.claims.claim_resume(self.rack, b)
        except (EtcdError, TimeoutError) as err:
            agent.mark_down(err)
            return ""
        return self._count(grant, d.action)

    def _count(self, grant: Grant, action: Action) -> str:
        if grant.granted:
            self.claims_granted += 1
            return ""
        self.claims_refused += 1
        if action is Action.DRAIN:
            return f"drain withheld: {grant.why}"
        return grant.why if grant.why.startswith("staggered") else f"staggered: {grant.why}"


def _with_own(base: ClusterView, local: ClusterView, node: str, rack: str) -> ClusterView:
    """The scheduler's view, with this node as its own ledger has it (fresher than a read)."""
    out = {k: v for k, v in base.out.items() if k != node}
    mine = local.out.get(node)
    if mine is not None:
        out[node] = replace(mine, rack=rack)
    racks = dict(base.racks)
    if node not in racks.get(rack, ()):
        racks[rack] = (*racks.get(rack, ()), node)
    trips = tuple(
        sorted(
            [
                *(t for t in base.trips if t.node != node),
                *(t for t in local.trips if t.node == node),
            ],
            key=lambda e: e.at,
        )
    )
    resumes = tuple(
        sorted(
            [
                *(r for r in base.resumes if r.node != node),
                *(r for r in local.resumes if r.node == node),
            ],
            key=lambda e: e.at,
        )
    )
    total = base.total_nodes
    if total is not None and not any(node in ns for ns in base.racks.values()):
        total += 1
    return ClusterView(MappingProxyType(racks), MappingProxyType(out), trips, resumes, total)


_RESEND_S = 5.0  # a published cap wattage not mirrored back by then is sent again


async def _quiet(job: object) -> None:
    """A side job's failure is logged, never raised into the agent's tasks."""
    assert asyncio.iscoroutine(job)
    try:
        await job
    except EtcdError as err:
        log.warning("etcd side job failed: %s", err)
