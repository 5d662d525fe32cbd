"""One GPU's tracker: its latest readings, margin forecast, load steps and raw windows.

Fed every reading of one GPU (temperature, slowdown and shutdown thresholds,
power, power limit); the evaluation reads what it kept: fresh values, the margin
forecaster's trend, the heating rate over the two confirm windows, whether power
is steady, and the thermal-resistance estimate.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from math import isfinite
from typing import Final

from policies.forecast import SeriesForecaster, z_for
from policies.headroom import ResistanceEstimator
from policies.kernel import TemperatureWindows
from policies.kernel.buckets import BucketWindow
from policies.kernel.samples import RecentSamples, TimedValues
from policies.kernel.windows import ConfirmWindows, Values, mid, within_one_step
from policies.model import Reading, SensorKind
from policies.settings import PolicySettings

_NOMINAL_POWER_LIMIT_W: Final = 500.0  # load-step scale when a GPU reports no power limit


@dataclass(slots=True, eq=False)
class GpuTracker:
    """One GPU: its latest readings, its thermal-margin forecaster and load-step detection."""

    settings: PolicySettings
    temperature: Reading | None = field(init=False, default=None)
    slowdown: Reading | None = field(init=False, default=None)
    shutdown: Reading | None = field(init=False, default=None)
    power: Reading | None = field(init=False, default=None)
    limit: Reading | None = field(init=False, default=None)
    # What the evaluation and the resistance estimate read of those readings, taken
    # once as they arrive (they are read at every sample and evaluation).
    # A value is NaN unless its reading is usable; a time is NaN with no reading.
    _temp_v: float = field(init=False, default=math.nan)
    _temp_t: float = field(init=False, default=math.nan)
    _slow_v: float = field(init=False, default=math.nan)
    _slow_t: float = field(init=False, default=math.nan)
    _slow_good: bool = field(init=False, default=False)  # usable: the margin's condition
    _shut_v: float = field(init=False, default=math.nan)
    _shut_t: float = field(init=False, default=math.nan)
    _power_v: float = field(init=False, default=math.nan)
    _power_t: float = field(init=False, default=math.nan)
    _limit_v: float | None = field(init=False, default=None)  # the power limit, when usable
    _limit_t: float = field(init=False, default=math.nan)
    margin: SeriesForecaster = field(init=False)
    _power: BucketWindow = field(init=False)
    _power_ref: float | None = field(init=False, default=None)
    load_steps: int = field(init=False, default=0)
    # Recent load steps (bucket times).
    step_times: deque[float] = field(init=False, default_factory=lambda: deque(maxlen=16))
    # Raw samples for the fast signature (heating with flat power): temperatures over
    # two confirm windows, power over the settle time (a step's heating lasts that long).
    temps: TemperatureWindows = field(init=False, default_factory=ConfirmWindows)
    recent_power: RecentSamples = field(init=False, default_factory=RecentSamples)
    resistance: ResistanceEstimator = field(init=False)

    def __post_init__(self) -> None:
        s = self.settings
        self.margin = SeriesForecaster(s.trend(s.max_gpu_rate_c_per_min), floor=s.critical_margin_c)
        self._power = BucketWindow(s.trend_bucket_s, 2 * s.trend_bucket_s)
        # Twice the fewest buckets a fit needs: enough for the median's bounds, short enough
        # to follow a cold plate that degrades or is repaired within a few minutes.
        self.resistance = ResistanceEstimator(
            s.trend_bucket_s, 2 * s.trend_min_points, z_for(s.confidence)
        )

    def configure(self, settings: PolicySettings) -> None:
        """Read these settings from now on (a reload that keeps the windows' shape)."""
        self.settings = settings

    @property
    def temperature_at(self) -> float:
        """The monotonic time of the latest temperature reading (NaN: none yet)."""
        return self._temp_t

    def sample_resistance(self, reference: float | None) -> None:
        """Feed the thermal-resistance estimate with the latest temperature reading, if steady.

        Called after :meth:`observe` took that reading: it reads what observe kept of it
        (its value when usable, its time), not the reading's fields again.
        """
        watts = self._power_v  # NaN: no usable power reading
        value = self._temp_v  # NaN unless the reading is usable
        if reference is None or not isfinite(watts) or not isfinite(value):
            return
        now = self._temp_t
        if now - self._power_t > self.settings.stale_after_s:
            return
        # Asked at every temperature sample, the replay's hot path: each step below is
        # taken only when its answer can change what is kept.
        w = self.settings.flow_loss_confirm_s
        windows = self.temps
        spans = windows.spans(now, w)
        if spans is None:
            self._sample_scanning(now, value, reference, watts)
            return
        o_start, o_end, n_start, n_end = spans
        temps = windows.recent.values
        # Cooling at this power, the GPU reads above its steady temperature: the
        # newer window's highest reading bounds the resistance from above. The newest
        # reading's ratio bounds that bound from below, so when no kept sample is above
        # it (the common case) the window is not scanned.
        if (
            watts > 0.0
            and n_end > n_start
            and not self.resistance.highest <= (temps[n_end - 1] - reference) / watts
        ):
            bound = (max(temps[n_start:n_end]) - reference) / watts
            if self.resistance.capped_by(bound):
                values = sorted(temps[n_start:n_end]), sorted(temps[o_start:o_end])
                if self._cooling_at_flat_power(values, now):
                    self.resistance.cap(bound)
        # Not steady while power moves, or while heating faster than a load step would
        # (only the newer window counts here; the rate needs both to be defined).
        steady = self.power_steady()
        # |a| <= fastest (a: the newer window's slope) is steady whatever the older
        # window says, and whatever one reading step resolves it to (0.0 is slower).
        if (
            steady
            and windows.beyond(n_start, n_end, self.settings.max_gpu_rate_c_per_s)
            and windows.slope(o_start, o_end) is not None
        ):
            values = sorted(temps[n_start:n_end]), sorted(temps[o_start:o_end])
            steady = within_one_step(values)
        self.resistance.add(now, value - reference, watts, steady)

    def _sample_scanning(self, now: float, value: float, reference: float, watts: float) -> None:
        """sample_resistance by its definition, for samples whose times are out of order."""
        values = self.temps.values_of(now, self.settings.flow_loss_confirm_s, None)
        if self._cooling_at_flat_power(values, now) and watts > 0.0:
            self.resistance.cap((values[0][-1] - reference) / watts)
        rates = self.heating_rate(now)
        fastest = self.settings.max_gpu_rate_c_per_s
        steady = self.power_steady() and (rates is None or abs(rates[0]) <= fastest)
        self.resistance.add(now, value - reference, watts, steady)

    def fast_heating(self, now: float, fastest: float) -> float | None:
        """The newer window's heating rate (C/s) when both windows' exceed ``fastest`` > 0."""
        return self.temps.fast(now, self.settings.flow_loss_confirm_s, fastest)

    def heating_rate(self, now: float) -> tuple[float, float] | None:
        """The temperature slope (C/s) over the last and the previous confirm window.

        None until both windows hold enough samples: one sample cannot make a rate,
        and a rise must last two windows to count (a blip that recovers does not).
        (0.0, 0.0) when the windows' levels differ by no more than one reading step:
        NVML reports whole degrees, and over a few seconds a steady temperature reads
        as one step up or down, whose pairwise slope looks like fast heating.
        """
        return self.temps.rates(now, self.settings.flow_loss_confirm_s)

    def _cooling_at_flat_power(self, values: Values, now: float) -> bool:
        """The newer window's median under the older's, power flat over both.

        Medians of three or more readings, so one glitch cannot make a GPU look
        cooling; power flat over the windows, because a GPU whose load just rose
        still cools for a moment below its new steady temperature. ``values``: the
        sorted temperatures of the newer and the older window.
        """
        newer, older = values
        if len(newer) < 3 or len(older) < 3 or mid(newer) >= mid(older):
            return False
        since = now - 2 * self.settings.flow_loss_confirm_s
        watts = self.recent_power.values_since(since)
        return bool(watts) and max(watts) - min(watts) <= self._load_step_w()

    def _load_step_w(self) -> float:
        limit = self._limit_v
        return self.settings.load_step_fraction * (limit or _NOMINAL_POWER_LIMIT_W)

    def power_steady(self) -> bool:
        """No power change of a load step over the settle time (and none detected)."""
        if self.recent_power.count < 2:
            return False
        return self.recent_power.spread() <= self._load_step_w()

    def observe(self, r: Reading) -> None:
        """Take one reading of this GPU."""
        take = TAKES.get(r.kind)
        if take is not None:
            take(self, r)

    def _take_temperature(self, r: Reading) -> None:
        self.temperature = r
        mono = self._temp_t = r.mono
        value = r.value
        if value is None or not r.usable:
            self._temp_v = math.nan
            return
        self._temp_v = value
        self.temps.add(mono, value, self.settings.temperature_keep_s)
        if self._slow_good:
            self.margin.add(mono, self._slow_v - value)

    def _take_slowdown(self, r: Reading) -> None:
        self.slowdown = r
        self._slow_t = r.mono
        value = r.value
        self._slow_good = value is not None and r.usable
        self._slow_v = value if value is not None and self._slow_good else math.nan

    def _take_power(self, r: Reading) -> None:
        self.power = r
        mono = self._power_t = r.mono
        value = r.value
        if value is None or not r.usable:
            self._power_v = math.nan
            return
        self._power_v = value
        self.recent_power.add(mono, value, self.settings.power_keep_s)
        if self._power.add(mono, value):
            self._check_load_step()

    def _take_limit(self, r: Reading) -> None:
        self.limit = r
        self._limit_t = r.mono
        self._limit_v = r.value if r.usable else None

    def _take_shutdown(self, r: Reading) -> None:
        self.shutdown = r
        self._shut_t = r.mono
        value = r.value
        self._shut_v = value if value is not None and r.usable else math.nan

    def fresh_temperature(self, now: float, stale_after_s: float) -> float | None:
        """``fresh_value(self.temperature, now, stale_after_s)``, from what observe kept."""
        value = self._temp_v
        # NaN (not usable) fails value - value == 0.0; written out: one call, not three.
        return value if value - value == 0.0 and not now - self._temp_t > stale_after_s else None

    def fresh_slowdown(self, now: float, stale_after_s: float) -> float | None:
        """``fresh_value(self.slowdown, now, stale_after_s)``, from what observe kept."""
        value = self._slow_v
        # NaN (not usable) fails value - value == 0.0; written out: one call, not three.
        return value if value - value == 0.0 and not now - self._slow_t > stale_after_s else None

    def fresh_limit(self, now: float, stale_after_s: float) -> float | None:
        """``fresh_value(self.limit, now, stale_after_s)``, from what observe kept."""
        value = self._limit_v
        return value if value is not None and not now - self._limit_t > stale_after_s else None

    def fresh_power(self, now: float, stale_after_s: float) -> float | None:
        """The power drawn (W) when its reading is usable and fresh."""
        value = self._power_v
        fresh = math.isfinite(value) and not now - self._power_t > stale_after_s
        return value if fresh else None

    def fresh_shutdown(self, now: float, stale_after_s: float) -> float | None:
        """``fresh_value(self.shutdown, now, stale_after_s)``, from what observe kept."""
        value = self._shut_v
        # NaN (not usable) fails value - value == 0.0; written out: one call, not three.
        return value if value - value == 0.0 and not now - self._shut_t > stale_after_s else None

    def _check_load_step(self) -> None:
        bucket = self._power.newest
        assert bucket is not None
        ref = self._power_ref
        self._power_ref = bucket.value
        if ref is None:
            return
        if abs(bucket.value - ref) > self._load_step_w():
            # A job started, stopped or was capped: the temperature follows the load
            # for a while. That is load, not a thermal trend: fit afresh once it settles.
            self.load_steps += 1
            self.step_times.append(bucket.t)
            self.margin.restart(bucket.t + self.settings.load_settle_s)

    @property
    def recent_temp(self) -> TimedValues:
        """The raw temperatures kept for the confirm windows."""
        return self.temps.recent


# What each GPU kind's reading updates (a table: asked for every GPU reading, by
# GpuTracker.observe and by the tracker that routes readings, which calls it directly).
TAKES: Final[dict[SensorKind, Callable[[GpuTracker, Reading], None]]] = {
    SensorKind.GPU_TEMPERATURE: GpuTracker._take_temperature,
    SensorKind.GPU_SLOWDOWN_THRESHOLD: GpuTracker._take_slowdown,
    SensorKind.GPU_POWER: GpuTracker._take_power,
    SensorKind.GPU_POWER_LIMIT: GpuTracker._take_limit,
    SensorKind.GPU_SHUTDOWN_THRESHOLD: GpuTracker._take_shutdown,
}
