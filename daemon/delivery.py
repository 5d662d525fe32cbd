"""Hands decisions to the scheduler sink: retries until confirmed, coalesces per node.

In memory for now: a decision survives a scheduler outage but not a restart of
rackguard (the durable SQLite outbox replaces this).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import OrderedDict, deque
from dataclasses import dataclass

from adapters.base import DeliveryError, SchedulerSink
from policies.model import Action, Decision

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Pending:
    """A decision waiting for the scheduler to confirm it."""

    decision: Decision
    attempts: int = 0
    last_error: str = ""


class DeliveryQueue:
    """At most one pending decision per node: the newest intent wins."""

    def __init__(
        self,
        sink: SchedulerSink | None,
        *,
        retry_initial_s: float = 1.0,
        retry_max_s: float = 60.0,
        rng: random.Random | None = None,
    ) -> None:
        self._sink = sink
        self._retry_initial_s = retry_initial_s
        self._retry_max_s = retry_max_s
        self._rng = rng or random.Random()
        self._pending: OrderedDict[str, Pending] = OrderedDict()
        self._wakeup = asyncio.Event()
        # What the scheduler last confirmed per node (None: never touched by us).
        self.confirmed: dict[str, Action] = {}
        self.delivered: deque[Decision] = deque(maxlen=1000)
        self.failed: deque[tuple[Decision, str]] = deque(maxlen=1000)

    def submit(self, decision: Decision) -> None:
        """Queue a decision; a newer one for the same node replaces an undelivered one."""
        if decision.dry_run:
            return
        node = decision.node
        if node in self._pending:
            replaced = self._pending.pop(node).decision
            # e.g. a drain then a resume, neither delivered: the scheduler never
            # saw the drain, so the resume is not needed either.
            if decision.action is self.confirmed.get(node, Action.RESUME):
                log.info(
                    "%s: %s supersedes undelivered %s; nothing left to send",
                    node,
                    decision.action,
                    replaced.action,
                )
                return
            log.info("%s: %s supersedes undelivered %s", node, decision.action, replaced.action)
        self._pending[node] = Pending(decision)
        self._wakeup.set()

    def pending(self) -> list[Pending]:
        """Decisions not yet confirmed, oldest first."""
        return list(self._pending.values())

    def _retry_delay(self, attempts: int) -> float:
        base = min(self._retry_max_s, self._retry_initial_s * 2.0 ** min(attempts - 1, 30))
        return float(base * self._rng.uniform(0.5, 1.0))

    async def run(self) -> None:
        """Deliver until cancelled."""
        while True:
            if not self._pending:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            node, item = next(iter(self._pending.items()))
            if self._sink is None:
                log.warning(
                    "%s: no scheduler configured; %s not delivered", node, item.decision.action
                )
                self._pending.pop(node)
                continue
            item.attempts += 1
            try:
                await self._sink.deliver(item.decision)
            except DeliveryError as err:
                item.last_error = str(err)
                if err.permanent:
                    log.error(
                        "%s: %s refused by %s, not retried: %s",
                        node,
                        item.decision.action,
                        self._sink.name,
                        err,
                    )
                    self._drop(node, item)
                    self.failed.append((item.decision, str(err)))
                    continue
                delay = self._retry_delay(item.attempts)
                level = logging.WARNING if item.attempts == 1 else logging.DEBUG
                log.log(
                    level,
                    "%s: delivering %s to %s failed (attempt %d), retry in %.1fs: %s",
                    node,
                    item.decision.action,
                    self._sink.name,
                    item.attempts,
                    delay,
                    err,
                )
                # Sleep, but wake early if a newer decision replaces this one.
                self._wakeup.clear()
                try:
                    async with asyncio.timeout(delay):
                        await self._wakeup.wait()
                except TimeoutError:
                    pass
                continue
            self._drop(node, item)
            self.confirmed[node] = item.decision.action
            self.delivered.append(item.decision)
            log.info(
                "%s: %s confirmed by %s after %d attempt(s)",
                node,
                item.decision.action,
                self._sink.name,
                item.attempts,
            )

    def _drop(self, node: str, item: Pending) -> None:
        if self._pending.get(node) is item:
            del self._pending[node]
