"""Runs the predictive policy over the latest readings on a fixed cadence and hands decisions on."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Protocol

from daemon.clock import decision_in_unix
from daemon.service.state import StateStore
from policies.model import Action, Condition, Decision, FaultDomain, Quality, Reading
from policies.policy import Outcome, Policy
from policies.power_cap import CapDecision
from policies.rules import NodeState
from policies.safety import BreakerState, ClusterLedger, ClusterView, Overrides
from policies.settings import PolicySettings

log = logging.getLogger(__name__)

LOCAL_RACK = "local"  # the rack name when the node's rack is not configured


class Gate(Protocol):
    """The fleet's say before a decision is made (daemon/cluster/fleet.py)."""

    def breaker(self, current: BreakerState, now: float) -> BreakerState:
        """The storm breaker in force."""

    async def admit(self, outcome: Outcome) -> str:
        """Why the decision may not be made now; "" when it may."""


class PolicyEngine:
    """Owns this node's policy state; the policy itself stays pure.

    The node is evaluated with the rack evidence its own sources report (PDU
    inlet air, coolant). ``cluster_view`` supplies what other nodes look like
    (out of service, recent trips and resumes) for budgets, the storm breaker
    and the resume stagger; until a scheduler-fed view is wired in, it is this
    agent's own ledger. ``overrides`` holds the operator's pins, pause and storm
    reset (set by the API).
    """

    def __init__(
        self,
        node: str,
        settings: PolicySettings,
        store: StateStore,
        on_decision: Callable[[Decision], None],
        *,
        rack: str = "",
        history: int = 1000,
    ) -> None:
        self.node = node
        self.rack = rack or LOCAL_RACK
        self._store = store
        self._on_decision = on_decision
        racks = {self.rack: (node,)}
        self.policy = Policy(settings, racks, default_node=node)
        self.ledger = ClusterLedger(racks, _ledger_horizon(settings))
        self.cluster_view: Callable[[float], ClusterView] = self.ledger.view
        self.overrides = Overrides()
        self.gate: Gate | None = None
        self.last: Outcome | None = None
        self.last_wall: float | None = None  # Unix time of the last evaluation
        self.decisions: deque[Decision] = deque(maxlen=history)
        self._absent_logged: set[str] = set()
        # Where the cap rung's decisions go (daemon/service/power_cap.py): handed on
        # before the node's own decision of the same evaluation.
        self.on_caps: Callable[[list[CapDecision]], None] | None = None

    @property
    def settings(self) -> PolicySettings:
        """The policy settings in force; assigning new ones keeps the node's state."""
        return self.policy.settings

    @settings.setter
    def settings(self, new: PolicySettings) -> None:
        self.policy.reconfigure(new)
        self.ledger.horizon_s = _ledger_horizon(new)

    @property
    def state(self) -> NodeState:
        """The node's policy state (action, since, healthy timer, epoch, domain)."""
        return self.policy.states[self.node]

    def evaluate_once(self, now: float, wall: float) -> Outcome:
        """One pass of the policy at monotonic ``now``."""
        return self._hand_on(self._evaluate(now, wall), now, wall)

    async def step(self, now: float, wall: float) -> Outcome:
        """One pass, with the gate's claim made before a decision is handed on."""
        if self.gate is None:
            return self.evaluate_once(now, wall)
        state, breaker = self.policy.states[self.node], self.gate.breaker(self.policy.breaker, now)
        self.policy.breaker = breaker
        outcome = self._evaluate(now, wall)
        if outcome.decision is not None:
            why = await self.gate.admit(outcome)
            if why:
                # Not made: the policy's state is as if it had not been decided.
                self.policy.states[self.node] = state
                outcome = replace(outcome, state=state, decision=None, note=why, critical=False)
        return self._hand_on(outcome, now, wall)

    def _evaluate(self, now: float, wall: float) -> Outcome:
        readings = self._store.readings()
        self._log_absent(readings)
        self.policy.observe(readings)
        outcome = self.policy.evaluate(
            now, wall, self.cluster_view(now), self.overrides, nodes=(self.node,)
        )[self.node]
        if self.on_caps is not None and self.policy.cap_decisions:
            self.on_caps(list(self.policy.cap_decisions))
        return outcome

    def _hand_on(self, outcome: Outcome, now: float, wall: float) -> Outcome:
        if outcome.decision is not None:
            # Handed on to people and programs: its evidence in Unix time, as its `at` is.
            outcome = replace(outcome, decision=decision_in_unix(outcome.decision, now))
        before = self.last
        self._log_changes(before, outcome)
        self.last, self.last_wall = outcome, wall
        if outcome.decision is not None:
            d = outcome.decision
            self.ledger.record(d, now, critical=outcome.critical, following=outcome.following)
            self.decisions.append(d)
            verb = "would " + d.action.value if d.dry_run else d.action.value
            log.info("%s: decision %s, domain %s: %s [%s]", d.node, verb, d.domain, d.reason, d.key)
            self._on_decision(d)
        return outcome

    def _log_absent(self, readings: Iterable[Reading]) -> None:
        """Say once per series that a sensor is absent (not fitted): it is left out, not a fault."""
        for r in readings:
            if r.quality is Quality.ABSENT and r.key not in self._absent_logged:
                self._absent_logged.add(r.key)
                log.warning("%s: sensor %s is absent (%s): left out", self.node, r.key, r.reason)

    def _log_rack_changes(self, before: Outcome | None, after: Outcome) -> None:
        """The rack's (and its cooling loop's) assessment: log each change of condition."""
        old, new = before.rack if before else None, after.rack
        if new is None or (
            old is not None and (old.condition, old.domain) == (new.condition, new.domain)
        ):
            return
        healthy = new.condition is Condition.OK
        level = logging.INFO if healthy else logging.WARNING
        if old is None and healthy:
            level = logging.DEBUG
        words = "the rack" if new.domain is not FaultDomain.COOLING_LOOP else "the cooling loop"
        log.log(
            level,
            "%s: rack %s %s (%s): %s",
            self.node,
            new.subject,
            new.condition,
            words if not healthy else "healthy",
            new.detail or "no detail",
        )

    def _log_changes(self, before: Outcome | None, after: Outcome) -> None:
        self._log_rack_changes(before, after)
        old = before.node.condition if before else None
        new = after.node.condition
        if new != old:
            # Decisions are the state changes worth INFO; data going missing
            # (UNKNOWN) or coming back is worth saying once too.
            level = logging.DEBUG
            if old is not None and Condition.UNKNOWN in (old, new):
                level = logging.WARNING if new is Condition.UNKNOWN else logging.INFO
            detail = after.node.detail or "no detail"
            log.log(level, "%s: thermal condition %s (%s)", self.node, new, detail)
        if after.note != (before.note if before else "") and after.note.startswith(
            ("drain withheld", "staggered")
        ):
            log.info("%s: %s", self.node, after.note)

    def restore(self, action: Action, now: float, domain: FaultDomain = FaultDomain.NONE) -> None:
        """Adopt a state decided earlier (e.g. across a restart), with its fault domain.

        Out for the cooling loop or the rack, the node is not resumed before that
        evidence has been seen fresh again.
        """
        self.policy.restore(self.node, action, now, domain)
        self.ledger.restore(self.node, action, self.policy.states[self.node].domain, now)

    async def run(self, interval_s: float) -> None:
        """Evaluate every ``interval_s`` seconds until cancelled."""
        while True:
            # time.monotonic(), not loop.time(): readings are stamped with it,
            # and uvloop's loop clock is a different (cached, ms) clock.
            await self.step(time.monotonic(), time.time())
            await asyncio.sleep(interval_s)


def _ledger_horizon(s: PolicySettings) -> float:
    return max(s.storm_window_s, s.resume_window_s)
