"""Trend and forecast: a robust slope with its confidence bounds, time-to-threshold, and skill.

* :func:`theil_sen` fits the median pairwise slope of bucket means, with Sen's
  rank-based confidence bounds: a few outliers (a glitch, a stuck reading) do not
  move it, and its bounds say how sure the slope is.
* :class:`SeriesForecaster` keeps one series' window and fits it each time a
  bucket closes. A fit whose recent half clearly disagrees with the whole window
  (a step that has settled, a ramp that stopped) is judged by the flatter of the
  two, so a load step is not extrapolated as a ramp.
* Every forecaster is scored against persistence (the last bucket mean) at a
  fixed horizon as the data arrives; it is *trusted* only while its recent
  errors are smaller than persistence's. An untrusted or insignificant trend
  forecasts persistence and predicts no threshold crossing.

Pure: samples and their timestamps in, numbers out. Same input, same output.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from statistics import NormalDist

import msgspec

from policies.kernel import SlopeStore
from policies.kernel.buckets import Bucket, BucketWindow
from policies.kernel.slopes import SortedSlopes, pair_slopes, sen


class Trend(msgspec.Struct, frozen=True):
    """A fitted line: slope (units per second) with one-sided bounds, and its level at t_ref.

    A Struct: one is built at every fit of every series. Its level is worked out when
    read (the policy reads the slope and its bounds; the level is for people and tests).
    """

    slope: float
    lo: float
    hi: float
    t_ref: float
    n: int
    span_s: float
    points: tuple[Bucket, ...]  # the buckets fitted, oldest first

    @property
    def level(self) -> float:
        """The fitted value at ``t_ref``: the median of the points' offsets from the slope."""
        n, slope, t_ref = self.n, self.slope, self.t_ref
        offsets = [p.value - slope * (p.t - t_ref) for p in self.points]
        offsets.sort()
        return offsets[n // 2] if n % 2 else (offsets[n // 2 - 1] + offsets[n // 2]) / 2.0

    def at(self, t: float) -> float:
        """The fitted value at time ``t``."""
        return self.level + self.slope * (t - self.t_ref)

    @property
    def rising(self) -> bool:
        """The slope is above zero at the fit's confidence."""
        return self.lo > 0.0

    @property
    def falling(self) -> bool:
        """The slope is below zero at the fit's confidence."""
        return self.hi < 0.0

    @property
    def significant(self) -> bool:
        """Rising or falling at the fit's confidence."""
        return self.rising or self.falling


def z_for(confidence: float) -> float:
    """The one-sided normal quantile for a confidence level in (0.5, 1)."""
    return NormalDist().inv_cdf(confidence)


def theil_sen(points: list[Bucket], z: float) -> Trend | None:
    """Median pairwise slope with Sen's one-sided bounds at quantile ``z``; None under 3 points."""
    if len(points) < 3:
        return None
    return theil_sen_of(points, pair_slopes(points), z)


def theil_sen_of(points: list[Bucket], slopes: list[float], z: float) -> Trend | None:
    """:func:`theil_sen` given the pairwise slopes of ``points`` (in any order; sorted here)."""
    n = len(points)
    if n < 3 or len(slopes) < 3:
        return None
    slopes.sort()
    slope, lo, hi = sen(n, slopes, z)
    return _line(points, slope, lo, hi)


def _line(points: list[Bucket], slope: float, lo: float, hi: float) -> Trend:
    """The trend of ``points`` with that slope and bounds (its level, the median offset)."""
    t_ref = points[-1].t
    return Trend(slope, lo, hi, t_ref, len(points), t_ref - points[0].t, tuple(points))


class TimeToThreshold(msgspec.Struct, frozen=True, gc=False):
    """Seconds until a series reaches a threshold: point estimate and the early/late bounds.

    None means "not reaching it" at that bound (moving away, or flat).
    """

    point_s: float | None
    early_s: float | None
    late_s: float | None


def time_to_threshold(
    trend: Trend, level: float, threshold: float, *, falling: bool
) -> TimeToThreshold:
    """When a series now at ``level`` and moving along ``trend`` reaches ``threshold``."""
    gap = level - threshold if falling else threshold - level
    if gap <= 0.0:
        return TimeToThreshold(0.0, 0.0, 0.0)
    speed = -trend.slope if falling else trend.slope
    fast = -trend.lo if falling else trend.hi
    slow = -trend.hi if falling else trend.lo
    return TimeToThreshold(
        gap / speed if speed > 0 else None,
        gap / fast if fast > 0 else None,
        gap / slow if slow > 0 else None,
    )


@dataclass(slots=True, eq=False)
class SkillTracker:
    """Scores a forecaster against persistence at one horizon over the last ``keep`` verdicts.

    ``record`` a forecast made at ``t`` for ``t + horizon``; ``score`` resolves the
    forecasts that have come due with the value observed then. O(1) per call.
    """

    horizon_s: float
    keep: int
    max_pending: int
    margin: float  # trust needs errors this much below persistence's
    sum_forecast: float = field(default=0.0, init=False)
    sum_persistence: float = field(default=0.0, init=False)
    _pending: deque[tuple[float, float, float]] = field(init=False)
    _scores: deque[tuple[float, float]] = field(init=False, default_factory=deque)

    def __post_init__(self) -> None:
        self._pending = deque(maxlen=self.max_pending)

    def record(self, t: float, forecast: float, persisted: float) -> None:
        """A forecast made at ``t`` (and the persistence forecast made with it)."""
        self._pending.append((t + self.horizon_s, forecast, persisted))

    def score(self, t: float, actual: float, tolerance_s: float) -> None:
        """Resolve every pending forecast due by ``t + tolerance_s`` against ``actual``."""
        pending = self._pending
        while pending and pending[0][0] <= t + tolerance_s:
            _, forecast, persisted = pending.popleft()
            verdict = (abs(forecast - actual), abs(persisted - actual))
            self._scores.append(verdict)
            self.sum_forecast += verdict[0]
            self.sum_persistence += verdict[1]
            if len(self._scores) > self.keep:
                old_f, old_p = self._scores.popleft()
                self.sum_forecast -= old_f
                self.sum_persistence -= old_p

    def drop_pending(self) -> None:
        """Forget forecasts not yet due (they were made about a regime that has ended)."""
        self._pending.clear()

    @property
    def scored(self) -> int:
        """Verdicts in the record."""
        return len(self._scores)

    @property
    def trusted(self) -> bool:
        """The forecaster's recent errors are clearly smaller than persistence's."""
        # The absolute slack keeps round-off of equal forecasts from counting as a win.
        bar = self.sum_persistence * (1.0 - self.margin) - 1e-9
        return self.scored > 0 and self.sum_forecast < bar


@dataclass(frozen=True, slots=True)
class TrendSettings:
    """How a series is bucketed, fitted and scored."""

    bucket_s: float = 10.0
    window_s: float = 300.0
    min_points: int = 6
    confidence: float = 0.9
    skill_horizon_s: float = 60.0
    skill_keep: int = 12
    # Trust needs errors this much below persistence's (0.2: at least 20 % smaller).
    skill_margin: float = 0.2
    # A change between two buckets faster than this (units per second) is a step, not
    # a trend: the fit restarts after ``settle_s``. None: never.
    max_rate_per_s: float | None = None
    settle_s: float = 120.0


@dataclass(slots=True, eq=False)
class SeriesForecaster:
    """One slow series: its window, its current trend, and its skill against persistence."""

    settings: TrendSettings
    # A level the series cannot be forecast to fall under (a GPU's margin stops near
    # zero: the GPU throttles to hold its slowdown temperature).
    floor: float | None = field(default=None, kw_only=True)
    window: BucketWindow = field(init=False)
    skill: SkillTracker = field(init=False)
    trend: Trend | None = field(init=False, default=None)
    _z: float = field(init=False)
    # ``trusted``, asked for every GPU at every evaluation: it changes only when the
    # trend or the skill does, in add() and restart(), which set it.
    _trusted: bool = field(init=False, default=False)
    _since: float = field(init=False, default=-math.inf)
    # The sorted slopes of the whole window and of its recent half.
    _whole: SlopeStore = field(init=False, default_factory=SortedSlopes)
    _recent: SlopeStore = field(init=False, default_factory=SortedSlopes)

    def __post_init__(self) -> None:
        s = self.settings
        self.window = BucketWindow(s.bucket_s, s.window_s)
        self._z = z_for(s.confidence)
        pending = math.ceil(s.skill_horizon_s / s.bucket_s) + 2
        self.skill = SkillTracker(s.skill_horizon_s, s.skill_keep, pending, s.skill_margin)

    def add(self, t: float, value: float) -> bool:
        """Add a sample; True when a bucket closed (and the trend was refitted)."""
        window = self.window
        if not window.add(t, value):
            return False  # the common case: the sample went into the open bucket
        newest, before = window.newest, window.previous
        assert newest is not None
        s = self.settings
        if (
            s.max_rate_per_s is not None
            and before is not None
            and newest.t > before.t
            and abs(newest.value - before.value) > s.max_rate_per_s * (newest.t - before.t)
        ):
            self.restart(newest.t + s.settle_s)
            return True
        self.skill.score(newest.t, newest.value, s.bucket_s / 2.0)
        self.trend = trend = self._fit()
        self.skill.record(newest.t, self.candidate(s.skill_horizon_s), newest.value)
        self._trusted = trend is not None and trend.significant and self.skill.trusted
        return True

    def restart(self, since: float) -> None:
        """Start the trend afresh from ``since`` (a load step at its time + the settling time)."""
        self.window.reset()
        self._since = since
        self.trend = None
        self._trusted = False
        self.skill.drop_pending()

    def _fit(self) -> Trend | None:
        points = self.window.buckets(self._since)
        n = len(points)
        if n < self.settings.min_points or n < 3:
            return None
        z = self._z
        whole = self._whole.sen(points, z)
        if whole is None:
            return None
        recent_points = points[n // 2 :]
        recent = self._recent.sen(recent_points, z)
        if recent is None or recent[1] <= whole[0] <= recent[2]:
            return _line(points, whole[0], whole[1], whole[2])
        # The recent half says something else: a settled step or a stopped ramp is
        # judged by its flat recent half; an accelerating rise keeps the (slower) whole.
        if abs(recent[0]) < abs(whole[0]):
            return _line(recent_points, recent[0], recent[1], recent[2])
        return _line(points, whole[0], whole[1], whole[2])

    @property
    def persistence(self) -> float | None:
        """The last bucket mean (the persistence forecast at any horizon)."""
        newest = self.window.newest
        return newest.value if newest is not None else None

    def candidate(self, horizon_s: float) -> float:
        """The trend forecast at ``horizon_s`` whether trusted or not (persistence if no trend)."""
        newest = self.window.newest
        assert newest is not None
        trend = self.trend
        if trend is None or not trend.significant:
            return newest.value
        return self.project(newest.value, trend.slope, horizon_s)

    def project(self, base: float, slope: float, horizon_s: float) -> float:
        """``base`` moved along ``slope`` for ``horizon_s``, held at the floor."""
        # Anchored at the last bucket, not at the fitted level: while a trend is
        # still bending (an onset), the fit's level lags the data.
        value = base + slope * horizon_s
        if self.floor is not None and value < self.floor:
            return max(value, min(base, self.floor))
        return value

    @property
    def trusted(self) -> bool:
        """A significant trend from a forecaster that has been beating persistence."""
        return self._trusted

    def forecast(self, horizon_s: float, base: float | None = None) -> float | None:
        """The value expected ``horizon_s`` after the last bucket (or after ``base``).

        The trend if trusted, else persistence.
        """
        if base is None:
            base = self.persistence
        if base is None:
            return None
        if self.trusted:
            assert self.trend is not None
            return self.project(base, self.trend.slope, horizon_s)
        return base

    def time_to(self, threshold: float, *, falling: bool, at: float) -> TimeToThreshold | None:
        """Time from ``at`` until the trusted trend reaches ``threshold``; None if untrusted."""
        newest = self.window.newest
        trend = self.trend
        if not self._trusted or newest is None or trend is None:
            return None
        level = newest.value + trend.slope * (at - newest.t)
        return time_to_threshold(trend, level, threshold, falling=falling)
