"""Runs the policy over the latest readings on a fixed cadence and hands decisions on."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable

from daemon.state import StateStore
from policies.model import Action, Condition, Decision
from policies.threshold import NodeState, Outcome, ThresholdSettings, evaluate

log = logging.getLogger(__name__)


class PolicyEngine:
    """Owns the policy state of this node; the policy itself stays pure."""

    def __init__(
        self,
        node: str,
        settings: ThresholdSettings,
        store: StateStore,
        on_decision: Callable[[Decision], None],
        *,
        history: int = 1000,
    ) -> None:
        self.node = node
        self.settings = settings
        self._store = store
        self._on_decision = on_decision
        self.state = NodeState()
        self.last: Outcome | None = None
        self.decisions: deque[Decision] = deque(maxlen=history)

    def evaluate_once(self, now: float, wall: float) -> Outcome:
        """One pass of the policy at monotonic ``now``."""
        outcome = evaluate(self.node, self.state, self._store.readings(), now, wall, self.settings)
        before = self.last.node.condition if self.last else None
        after = outcome.node.condition
        if after != before:
            # Decisions are the state changes worth INFO; data going missing
            # (UNKNOWN) or coming back is worth saying once too.
            level = logging.DEBUG
            if before is not None and Condition.UNKNOWN in (before, after):
                level = logging.WARNING if after is Condition.UNKNOWN else logging.INFO
            detail = outcome.node.detail or "no detail"
            log.log(level, "%s: thermal condition %s (%s)", self.node, after, detail)
        self.state = outcome.state
        self.last = outcome
        if outcome.decision is not None:
            d = outcome.decision
            self.decisions.append(d)
            verb = "would " + d.action.value if d.dry_run else d.action.value
            log.info("%s: decision %s, domain %s: %s [%s]", d.node, verb, d.domain, d.reason, d.key)
            self._on_decision(d)
        return outcome

    def restore(self, action: Action, now: float) -> None:
        """Adopt a state decided earlier (e.g. across a config reload)."""
        self.state = NodeState(action=action, since=now, epoch=self.state.epoch)

    async def run(self, interval_s: float) -> None:
        """Evaluate every ``interval_s`` seconds until cancelled."""
        while True:
            # time.monotonic(), not loop.time(): readings are stamped with it,
            # and uvloop's loop clock is a different (cached, ms) clock.
            self.evaluate_once(time.monotonic(), time.time())
            await asyncio.sleep(interval_s)
