"""Replay: the policy over a recorded trace, every node of it, on a fixed evaluation grid.

Readings are taken in file order. Evaluations happen every ``interval_s`` of the
trace's monotonic time from its first reading: before a reading later than the
next evaluation time is taken, that evaluation runs over what came before it.
The cluster view (who is out, recent trips and resumes) comes from the policy's
own decisions. The same trace and settings always give the same decisions.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import InitVar, dataclass, field

from policies.model import Decision, Reading
from policies.policy import Outcome, Policy
from policies.safety import ClusterLedger, Overrides
from policies.settings import PolicySettings
from policies.trace import Header, Line, TraceError, encode_decision, parse_readings


@dataclass(frozen=True, slots=True)
class Tick:
    """One evaluation of every node."""

    now: float
    wall: float
    outcomes: dict[str, Outcome]

    @property
    def decisions(self) -> list[Decision]:
        """The decisions made at this evaluation, in node order."""
        return [o.decision for o in self.outcomes.values() if o.decision is not None]


@dataclass(eq=False)
class Replayer:
    """Feeds readings to a Policy and evaluates it on a grid; usable step by step."""

    header: Header
    settings: InitVar[PolicySettings]
    interval_s: float = field(default=1.0, kw_only=True)
    overrides: Overrides = field(default_factory=Overrides, kw_only=True)
    policy: Policy = field(init=False)
    ledger: ClusterLedger = field(init=False)
    _next: float | None = field(init=False, default=None)
    _last: Reading | None = field(init=False, default=None)

    def __post_init__(self, settings: PolicySettings) -> None:
        if self.interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {self.interval_s}")
        self.policy = Policy(settings, self.header.racks)
        horizon = max(settings.storm_window_s, settings.resume_window_s)
        self.ledger = ClusterLedger(self.header.racks, horizon)

    def feed(self, r: Reading) -> list[Tick]:
        """Take one reading; returns the evaluations due before it."""
        ticks = []
        if self._next is None:
            self._next = r.mono
        while r.mono > self._next:
            ticks.append(self.tick(self._next))
            self._next = self._after(self._next)
        self.policy.observe((r,))
        self._last = r
        return ticks

    def feed_all(self, readings: Iterable[Reading]) -> Iterator[Tick]:
        """Take many readings, as :meth:`feed` would one by one, yielding the evaluations.

        The readings between two evaluations go to the policy in one batch: the
        same readings in the same order before each evaluation, far fewer calls.
        """
        batch: list[Reading] = []
        nxt = self._next
        last = self._last  # kept in self._last whenever the policy is called
        for r in readings:
            mono = r.mono
            if nxt is None:
                nxt = self._next = mono
            if mono > nxt:
                self._last = last
                self.policy.observe(batch)
                batch.clear()
                while mono > nxt:
                    yield self.tick(nxt)
                    nxt = self._next = self._after(nxt)
            batch.append(r)
            last = r
        self._last = last
        self.policy.observe(batch)

    def finish(self) -> list[Tick]:
        """The evaluations due up to and including the last reading's time."""
        ticks = []
        if self._next is not None and self._last is not None:
            while self._next <= self._last.mono:
                ticks.append(self.tick(self._next))
                self._next = self._after(self._next)
        return ticks

    def _after(self, now: float) -> float:
        """The evaluation time after ``now``; TraceError where the grid cannot move on."""
        after = now + self.interval_s
        if not after > now:
            # Times so large that a step rounds away (1e306 + 1.0 == 1e306): every
            # evaluation would be at the same time, and the replay would never end.
            raise TraceError(
                f"monotonic time {now!r} is too large to evaluate every {self.interval_s!r} s"
            )
        return after

    def tick(self, now: float) -> Tick:
        """Evaluate every node at ``now``."""
        last = self._last
        wall = last.wall + (now - last.mono) if last is not None else now
        outcomes = self.policy.evaluate(now, wall, self.ledger.view(now), self.overrides)
        for o in outcomes.values():
            if o.decision is not None:
                self.ledger.record(o.decision, now, critical=o.critical, following=o.following)
        return Tick(now, wall, outcomes)


def replay(
    lines: Iterable[Line],
    settings: PolicySettings,
    *,
    interval_s: float = 1.0,
    overrides: Overrides | None = None,
) -> Iterator[Tick]:
    """Every evaluation over a trace (decision records in it are ignored)."""
    header, readings = parse_readings(lines)
    rp = Replayer(header, settings, interval_s=interval_s, overrides=overrides or Overrides())
    yield from rp.feed_all(readings)
    yield from rp.finish()


def replay_readings(
    header: Header,
    readings: Iterable[Reading],
    settings: PolicySettings,
    *,
    interval_s: float = 1.0,
    overrides: Overrides | None = None,
) -> Iterator[Tick]:
    """The same as :func:`replay` over readings already in memory."""
    rp = Replayer(header, settings, interval_s=interval_s, overrides=overrides or Overrides())
    yield from rp.feed_all(readings)
    yield from rp.finish()


def decision_lines(ticks: Iterable[Tick]) -> Iterator[str]:
    """The decisions of the evaluations as trace lines."""
    for t in ticks:
        for d in t.decisions:
            yield encode_decision(d, t.now)
