"""Level-triggered reconciliation: converge the scheduler's view of our nodes to our intent.

Every ``interval_s`` the reconciler reads the nodes rackguard has decided
about (the newest decision per node in the outbox is the intent) and, per node:

1. a decision is pending for it -> skip: delivery is on it;
2. unknown to the scheduler -> report, do nothing;
3. held by someone else or for another reason (the reason lacks
   ``rackguard:``) -> leave it alone, whatever we intend;
4. already as intended -> nothing;
5. otherwise (drifted: e.g. an operator resumed a node we drained, or a drain
   we meant to lift is still there) -> queue the intent again in the outbox,
   which reads the node once more before it writes.

Findings are logged when they change, not every round.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass

from adapters.schedulers.base import (
    NodeReadError,
    NodeView,
    ReadableSink,
    describe,
    exclude_down,
    intended,
)
from daemon.delivery.outbox import DecisionStore
from daemon.poller import Health, Poller

log = logging.getLogger(__name__)


class Finding(enum.StrEnum):
    """What one round found for one node."""

    IN_SYNC = "in_sync"
    DRIFTED = "drifted"  # a repair was queued
    FOREIGN = "foreign"  # held by someone else: left alone
    BUSY = "busy"  # a decision is pending: delivery handles it
    UNKNOWN_NODE = "unknown_node"


@dataclass(frozen=True, slots=True)
class NodeFinding:
    """One node's finding and the words for it."""

    node: str
    finding: Finding
    detail: str = ""


class Reconciler:
    """Periodically converges the scheduler to the outbox's intents."""

    def __init__(
        self,
        outbox: DecisionStore,
        sink: ReadableSink,
        *,
        interval_s: float = 60.0,
        on_read: Callable[[str, NodeView], None] = lambda node, view: None,
    ) -> None:
        self._outbox = outbox
        self._sink = sink
        self._on_read = on_read  # each node's state as read (the page's "read back at")
        self._last: dict[str, tuple[Finding, str]] = {}
        self.poller = Poller(
            "reconcile",
            self._round,
            interval_s=interval_s,
            failures=(NodeReadError,),
            on_change=self._changed,
        )
        self.rounds = 0
        self.repairs = 0

    async def reconcile_once(self) -> list[NodeFinding]:
        """One round; raises NodeReadError when the scheduler cannot be read."""
        intents = self._outbox.intents()
        if not intents:
            return []
        busy = self._outbox.busy_nodes()
        to_read = [n for n in intents if n not in busy]
        views = await self._sink.read_state(to_read) if to_read else {}
        self.rounds += 1
        findings = []
        down = exclude_down(self._sink)
        for node, intent in intents.items():
            if node in busy:
                findings.append(NodeFinding(node, Finding.BUSY))
                continue
            view = views[node]
            if view.exists:
                self._on_read(node, view)
            if not view.exists:
                f = NodeFinding(node, Finding.UNKNOWN_NODE, "unknown to the scheduler")
            elif view.foreign:
                f = NodeFinding(node, Finding.FOREIGN, f"left alone: {describe(view)}")
            elif view.satisfies(intent.action, exclude_down=down):
                f = NodeFinding(node, Finding.IN_SYNC, describe(view))
            else:
                wanted = intended(intent, exclude_down=down)
                note = f"intended {wanted} but the scheduler shows {describe(view)}"
                key = self._outbox.enqueue_repair(intent, note)
                if key is None:  # a newer decision arrived meanwhile
                    f = NodeFinding(node, Finding.BUSY)
                else:
                    self.repairs += 1
                    f = NodeFinding(node, Finding.DRIFTED, note)
            findings.append(f)
            self._report(f)
        return findings

    def _report(self, f: NodeFinding) -> None:
        before = self._last.get(f.node)
        self._last[f.node] = (f.finding, f.detail)
        if before == (f.finding, f.detail) or f.finding is Finding.DRIFTED:
            return  # DRIFTED is logged by the outbox as it queues the repair
        if f.finding is Finding.FOREIGN:
            log.warning("%s: held by someone else; rackguard leaves it alone: %s", f.node, f.detail)
        elif f.finding is Finding.UNKNOWN_NODE:
            log.warning("%s: %s", f.node, f.detail)
        elif before is not None and f.finding is Finding.IN_SYNC:
            log.info("%s: in sync with the scheduler: %s", f.node, f.detail)

    async def _round(self) -> None:
        await self.reconcile_once()

    def _changed(self, old: Health, new: Health, message: str) -> None:
        if new is not Health.UP:
            log.warning("reconcile: cannot read %s: %s", self._sink.name, message)
        elif old is not Health.STARTING:
            log.info("reconcile: %s readable again", self._sink.name)

    async def run(self) -> None:
        """Reconcile every ``interval_s`` until cancelled; read failures are retried next round."""
        await self.poller.run()
