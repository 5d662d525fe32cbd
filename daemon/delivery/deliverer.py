"""The deliverer: takes the store's oldest pending decision to the scheduler sink.

For a sink that can read nodes back it:

1. reads the node first: held by someone else or for another reason -> the row
   is SKIPPED and the node left alone; already in the intended state -> the row
   is CONFIRMED with no write (so a delivery interrupted by ``kill -9`` after
   the scheduler applied it is never applied twice);
2. notes durably that the write is starting, writes, then reads back: only the
   intended state read back confirms it.

A sink without read-back (the webhook) confirms with its answer. Failures are
retried head of line, so decisions reach the scheduler in the order they were
made:

- transient (unreachable, busy, 5xx): capped exponential backoff with jitter;
- refused for a cause an operator can fix (401/403/404, an unknown node, no
  permission): the same, ten times slower, with one ERROR line, /readyz not
  ready and the row visible in /v1/outbox until the refusal ends;
- final (a malformed request): the row FAILED. The node's next decision is
  delivered as usual, so the current intent still reaches the scheduler.

Every failed attempt is counted by reason (``failures``, the
``rackguard_delivery_failures_total`` metric); while attempts fail, a WARNING
sums them up once a minute. A decision still undelivered ``undeliverable_after_s``
after it was made is *undeliverable*: /readyz names it, the
``rackguard_delivery_undeliverable`` gauge counts it, and one log line marks each
decision entering and leaving that state (:meth:`Deliverer.watch`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from adapters.base import DeliveryError, SchedulerSink
from adapters.schedulers.base import (
    NodeReadError,
    NodeView,
    ReadableSink,
    describe,
    exclude_down,
    intended,
)
from daemon.delivery.outbox import DecisionStore, Pending, Row, Status
from daemon.poller import capped_backoff
from policies.model import Decision

log = logging.getLogger(__name__)

# Waits ``delay`` seconds or until the event is set; injectable so tests can
# run a ten-minute outage in simulated time.
Sleep = Callable[[float, asyncio.Event], Awaitable[None]]

# A refusal an operator must fix is retried this many times slower than an outage.
REFUSED_SLOWDOWN = 10.0
UNDELIVERABLE_AFTER_S = 120.0  # [scheduler] undeliverable_after_s's default
SUMMARY_EVERY_S = 60.0  # failed attempts are summed up at WARNING this often

# How a confirmed row's outcome starts: read back from the scheduler, or its answer only.
READ_BACK = "read back"
ALREADY = "already"
ACCEPTED = "accepted"


def confirmed_by(status: str, outcome: str) -> Literal["read_back", "answer", ""]:
    """``read_back`` (the scheduler showed the state), ``answer`` (it only said yes), or ""."""
    if status != Status.CONFIRMED:
        return ""
    if outcome.startswith((READ_BACK, ALREADY)):
        return "read_back"
    return "answer"


@dataclass(frozen=True, slots=True)
class ReadBack:
    """The scheduler's state of a node as last read back, and when (Unix time)."""

    state: str
    at: float


async def wait_or_wake(delay: float, wake: asyncio.Event) -> None:
    """The real Sleep: ``delay`` seconds, or less if ``wake`` is set."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(delay):
            await wake.wait()


class Deliverer:
    """Ordered delivery of the store's pending decisions to one sink."""

    def __init__(
        self,
        store: DecisionStore,
        sink: SchedulerSink | None,
        *,
        retry_initial_s: float = 1.0,
        retry_max_s: float = 60.0,
        rng: random.Random | None = None,
        sleep: Sleep = wait_or_wake,
        on_settled: Callable[[Decision, Status, str], None] | None = None,
        undeliverable_after_s: float = UNDELIVERABLE_AFTER_S,
        wall: Callable[[], float] = time.time,
        mono: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._sink = sink
        # Called once a delivered row is confirmed, skipped or failed (metrics, events).
        self.on_settled = on_settled
        # Called after each attempt, failed or not, with the row as it now stands (events).
        self.on_progress: Callable[[Row], None] | None = None
        self.undeliverable_after_s = undeliverable_after_s
        self._wall = wall
        self._mono = mono
        self._overdue: set[int] = set()  # seqs past the bound, as last logged
        self._unsummed: collections.Counter[str] = collections.Counter()  # since the summary
        self._last_error = ""
        self._summed_at = mono()
        self.read_back: dict[str, ReadBack] = {}  # node -> the scheduler's state, last read
        self._retry_initial_s = retry_initial_s
        self._retry_max_s = retry_max_s
        self._rng = rng or random.Random()
        self._sleep = sleep
        self._failures = 0  # consecutive failed attempts, for the backoff
        self.refusal = ""  # the operator-fixable refusal in force, else ""
        self.failures: collections.Counter[str] = collections.Counter()  # by reason

    def health(self) -> list[tuple[bool, str]]:
        """(ok, reason) for /readyz."""
        checks = [(False, describe_overdue(p, self._wall())) for p in self.undeliverable()]
        if self.refusal and self._sink is not None:
            checks.append(
                (False, f"delivery to {self._sink.name} refused, retrying: {self.refusal}")
            )
        return checks or [(True, "delivery: no refusal, nothing undeliverable")]

    def undeliverable(self) -> list[Pending]:
        """Pending decisions made longer than ``undeliverable_after_s`` ago, oldest first."""
        now = self._wall()
        return [p for p in self._store.pending() if now - p.queued_at >= self.undeliverable_after_s]

    async def watch(self, every_s: float = 1.0) -> None:
        """Until cancelled: log each decision turning undeliverable (and back), sum up failures."""
        while True:
            self.check()
            await asyncio.sleep(every_s)

    def check(self) -> None:
        """One pass of :meth:`watch`."""
        now = self._wall()
        overdue = {p.seq: p for p in self.undeliverable()}
        for seq in sorted(overdue.keys() - self._overdue):
            log.error("%s", describe_overdue(overdue[seq], now))
        for seq in sorted(self._overdue - overdue.keys()):
            log.info("decision #%d: no longer undeliverable (delivered, replaced or failed)", seq)
        self._overdue = set(overdue)
        mono = self._mono()
        if mono - self._summed_at < SUMMARY_EVERY_S:
            return
        if self._unsummed and self._sink is not None:
            reasons = ", ".join(f"{n} {r}" for r, n in sorted(self._unsummed.items()))
            pending = self._store.pending()
            oldest = (
                f"; oldest undelivered: {pending[0].decision.node} {pending[0].decision.action}"
                f" for {now - pending[0].queued_at:.0f}s"
                if pending
                else ""
            )
            log.warning(
                "%s: %d delivery attempt(s) failed in the last %.0fs (%s)%s; last error: %s",
                self._sink.name,
                sum(self._unsummed.values()),
                mono - self._summed_at,
                reasons,
                oldest,
                self._last_error,
            )
        self._unsummed.clear()
        self._summed_at = mono

    async def run(self) -> None:
        """Deliver until cancelled."""
        store = self._store
        while True:
            row = store.next_ready()
            if row is None:
                store.wakeup.clear()
                await store.wakeup.wait()
                continue
            decision = row.decision
            if self._sink is None:
                log.warning(
                    "%s: no scheduler configured; %s not delivered", decision.node, decision.action
                )
                await store.finish(row, Status.FAILED, "no scheduler configured", "no scheduler")
                continue
            store.inflight = row.seq
            store.count_attempt(row)
            try:
                status, outcome = await self._attempt(self._sink, row)
            except DeliveryError as err:
                store.inflight = None
                self.failures[err.reason] += 1
                self._unsummed[err.reason] += 1
                self._last_error = str(err)
                if err.final:
                    log.error(
                        "%s: %s refused by %s as malformed, not retried: %s",
                        decision.node,
                        decision.action,
                        self._sink.name,
                        err,
                    )
                    await store.finish(row, Status.FAILED, "refused", str(err))
                    self._settled(decision, Status.FAILED, str(err))
                    self._progress(row)
                    continue
                await store.record_error(row, str(err))
                self._progress(row)
                await self._back_off(row, err)
                continue
            store.inflight = None
            await store.finish(row, status, outcome)
            self._settled(decision, status, outcome)
            self._progress(row)
            if self.refusal:
                log.info("%s: accepting deliveries again", self._sink.name)
            elif self._failures:
                log.info("%s: reachable again", self._sink.name)
            self._failures = 0
            self.refusal = ""
            level = logging.WARNING if status is Status.SKIPPED else logging.INFO
            log.log(
                level,
                "%s: %s %s by %s after %d attempt(s): %s",
                decision.node,
                decision.action,
                status,
                self._sink.name,
                row.attempts,
                outcome,
            )

    def _settled(self, decision: Decision, status: Status, outcome: str) -> None:
        if self.on_settled is not None:
            self.on_settled(decision, status, outcome)

    def _progress(self, row: Row) -> None:
        if self.on_progress is not None:
            self.on_progress(row)

    async def _back_off(self, row: Row, err: DeliveryError) -> None:
        assert self._sink is not None
        decision = row.decision
        self._failures += 1
        slow = REFUSED_SLOWDOWN if err.permanent else 1.0
        base = capped_backoff(
            self._retry_initial_s * slow, self._retry_max_s * slow, self._failures
        )
        delay = base * self._rng.uniform(0.5, 1.0)
        if err.permanent:
            if not self.refusal:
                log.error(
                    "%s: %s refused by %s (%s): %s; an operator must fix this; "
                    "retrying every %.0fs at most",
                    decision.node,
                    decision.action,
                    self._sink.name,
                    err.reason,
                    err,
                    self._retry_max_s * slow,
                )
            self.refusal = f"{err.reason}: {err}"
        else:
            level = logging.WARNING if self._failures == 1 else logging.DEBUG
            log.log(
                level,
                "%s: delivering %s to %s failed (attempt %d), retry in %.1fs: %s",
                decision.node,
                decision.action,
                self._sink.name,
                row.attempts,
                delay,
                err,
            )
        # Sleep, but wake early if a newer decision arrives (it may replace this one).
        self._store.wakeup.clear()
        await self._sleep(delay, self._store.wakeup)

    async def _attempt(self, sink: SchedulerSink, row: Row) -> tuple[Status, str]:
        decision = row.decision
        if not isinstance(sink, ReadableSink):
            await self._store.mark_sent(row)
            await sink.deliver(decision)
            return Status.CONFIRMED, ACCEPTED
        node = decision.node
        down = exclude_down(sink)
        before = await self._read_one(sink, node)
        if before.foreign:
            return Status.SKIPPED, f"left alone: {describe(before)}"
        if before.satisfies(decision.action, exclude_down=down):
            return Status.CONFIRMED, f"{ALREADY} {describe(before)}"
        await self._store.mark_sent(row)
        await sink.deliver(decision)
        after = await self._read_one(sink, node)
        if after.satisfies(decision.action, exclude_down=down):
            return Status.CONFIRMED, f"{READ_BACK} {describe(after)}"
        if after.foreign:
            return Status.SKIPPED, f"taken over meanwhile: {describe(after)}"
        wanted = intended(decision, exclude_down=down)
        raise DeliveryError(
            f"{node}: written, but the scheduler shows {describe(after)}, not {wanted}"
        )

    async def _read_one(self, sink: ReadableSink, node: str) -> NodeView:
        try:
            views = await sink.read_state([node])
        except NodeReadError as err:
            raise DeliveryError(f"reading {node}: {err}", permanent=err.permanent) from err
        view = views.get(node)
        if view is None or not view.exists:
            raise DeliveryError(
                f"{node}: the scheduler does not know this node", permanent=True, reason="not_found"
            )
        self.note_read_back(node, view)
        return view

    def note_read_back(self, node: str, view: NodeView) -> None:
        """The scheduler's state of ``node`` as just read (by delivery or the reconciler)."""
        self.read_back[node] = ReadBack(describe(view), self._wall())


def describe_overdue(p: Pending, now: float) -> str:
    """``stage-01 exclude (decision #3) undeliverable for 130s: 8 attempt(s), last error: ...``."""
    error = f", last error: {p.last_error}" if p.last_error else ", not yet attempted"
    return (
        f"{p.decision.node} {p.decision.action} (decision #{p.seq}) undeliverable for"
        f" {now - p.queued_at:.0f}s: {p.attempts} attempt(s){error}"
    )
