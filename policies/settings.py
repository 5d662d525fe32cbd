"""Every knob of the predictive policy, defined once: default, bounds and meaning per field.

The daemon's ``[policy]`` table is loaded straight into these fields (its typed
TOML loader reads the bounds from the field metadata and names the key of any
problem); ``systemd/rackguard.example.toml`` documents each one.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from policies.bounds import bounded
from policies.forecast import TrendSettings

Problems = Iterator[tuple[str, str]]

# ASHRAE TC 9.9 allowable inlet-air maxima per class (the recommended range ends at 27 C).
ASHRAE_ALLOWABLE_INLET_C = {"A1": 32.0, "A2": 35.0, "A3": 40.0, "A4": 45.0}


@dataclass(frozen=True, slots=True)
class RackLimits:
    """Facility limits of one rack, overriding the ``[policy]`` defaults (unset = default)."""

    inlet_limit_c: float | None = bounded(None, ge=10, le=60, doc="inlet air limit of this rack")
    supply_limit_c: float | None = bounded(
        None, ge=5, le=80, doc="coolant supply limit of this rack's loop"
    )
    inlet_derate_limit_c: float | None = bounded(
        None, ge=10, le=45, doc="inlet air limit of this rack with GPU power derated"
    )


@dataclass(frozen=True, slots=True)
class PolicySettings:
    """The policy's settings, each with its bounds; cross-field checks in :meth:`validate`."""

    # Thermal margin = slowdown temperature - GPU temperature (both from NVML).
    enter_margin_c: float = bounded(5.0, ge=0, le=50, doc="drain at or under this margin")
    exit_margin_c: float = bounded(10.0, ge=0, le=60, doc="healthy again at or above this")
    critical_margin_c: float = bounded(0.0, ge=-10, le=50, doc="exclude at once at this margin")
    shutdown_margin_c: float = bounded(2.0, ge=0, le=20, doc="exclude this close to shutdown")
    # Timing.
    min_dwell_s: float = bounded(60.0, ge=0, doc="least time out of service before a resume")
    resume_after_s: float = bounded(300.0, ge=0, doc="healthy this long before a resume")
    stale_after_s: float = bounded(5.0, gt=0, doc="GPU readings older than this are UNKNOWN")
    rack_stale_after_s: float = bounded(30.0, gt=0, doc="the same for PDU and CDU readings")
    # Forecast.
    lead_time_s: float = bounded(600.0, gt=0, doc="time a job needs to checkpoint and leave")
    lead_margin: float = bounded(1.5, ge=1, le=4, doc="drain a breach within lead x this")
    confidence: float = bounded(0.9, ge=0.6, le=0.999, doc="one-sided confidence of bounds")
    trend_window_s: float = bounded(300.0, gt=0, doc="trend fit window")
    trend_bucket_s: float = bounded(10.0, ge=0.1, le=3600, doc="trend bucket (mean of its samples)")
    trend_min_points: int = bounded(6, ge=3, le=200, doc="fewest buckets a trend is fitted on")
    skill_horizon_s: float = bounded(60.0, gt=0, doc="horizon forecasts are scored at")
    skill_margin: float = bounded(
        0.2, ge=0, lt=1, doc="trusted: errors this far under persistence's"
    )
    max_gpu_rate_c_per_min: float = bounded(
        10.0, gt=0, doc="faster GPU margin changes are steps (load, pump), not trends"
    )
    max_air_rate_c_per_min: float = bounded(5.0, gt=0, doc="the same for air and coolant")
    load_step_fraction: float = bounded(0.1, gt=0, le=1, doc="a power change of this x limit")
    load_settle_s: float = bounded(120.0, ge=0, doc="after a load step the trend restarts")
    # Cooling-loop evidence.
    flow_low_fraction: float = bounded(0.5, gt=0, lt=1, doc="flow under this x its high: lost")
    supply_rise_c: float = bounded(1.0, gt=0, doc="supply this far above its window low: rising")
    flow_loss_confirm_s: float = bounded(
        5.0, gt=0, le=120, doc="lost flow confirmed by two fresh samples this far apart"
    )
    critical_grace_s: float = bounded(
        20.0, ge=0, le=600, doc="exclude when slowdown is this near at the heating rate"
    )
    # Facility limits (per rack overrides in ``racks``).
    inlet_limit_c: float = bounded(32.0, ge=10, le=60, doc="inlet air limit (ASHRAE A1 32 C)")
    supply_limit_c: float = bounded(45.0, ge=5, le=80, doc="coolant supply limit (ASHRAE W45)")
    # Unset: the inlet limit is the only one. Set (e.g. 35 for a site rated A2 with
    # derating), the cap ladder derates a rack's GPUs between the two (power_cap.py).
    inlet_derate_limit_c: float | None = bounded(
        None, ge=10, le=45, doc="inlet air limit with GPU power derated (A2 35, A4 45 C)"
    )
    racks: Mapping[str, RackLimits] = bounded({}, doc="per-rack facility limits")
    # Safety limits (predictive drains only; critical exclusions ignore them).
    rack_budget_nodes: int = bounded(2, ge=0, doc="GPU/node drains per rack: max(nodes, pct)")
    rack_budget_pct: float = bounded(25.0, ge=0, le=100, doc="rack budget, percent of the rack")
    cluster_budget_nodes: int = bounded(8, ge=0, doc="all predictive drains: max(nodes, pct)")
    cluster_budget_pct: float = bounded(5.0, ge=0, le=100, doc="cluster budget, percent")
    storm_window_s: float = bounded(600.0, gt=0, doc="trips are counted over this window")
    storm_trips: int = bounded(8, ge=1, doc="the breaker opens above max(trips, pct)")
    storm_pct: float = bounded(10.0, ge=0, le=100, doc="storm threshold, percent of cluster")
    resumes_per_window: int = bounded(1, ge=1, doc="resumes per rack per resume_window_s")
    resume_window_s: float = bounded(60.0, gt=0, doc="the resume stagger's window")
    resume_jitter: float = bounded(0.2, ge=0, le=1, doc="each node waits up to this x more")
    dry_run: bool = bounded(False, doc="decide and report, send nothing")

    @property
    def drain_horizon_s(self) -> float:
        """A predicted breach this close (earliest plausible time) drains the node."""
        return self.lead_time_s * self.lead_margin

    @property
    def max_gpu_rate_c_per_s(self) -> float:
        """``max_gpu_rate_c_per_min`` per second: heating faster is not a load step."""
        return self.max_gpu_rate_c_per_min / 60.0

    @property
    def temperature_keep_s(self) -> float:
        """How long a GPU's raw temperatures are kept: its two confirm windows."""
        return 2 * self.flow_loss_confirm_s + 1.0

    @property
    def power_keep_s(self) -> float:
        """How long a GPU's raw power samples are kept: a step's settling, both windows."""
        return max(self.load_settle_s, 2 * self.flow_loss_confirm_s)

    def inlet_limit(self, rack: str) -> float:
        """The inlet-air limit in force for ``rack``."""
        own = self.racks.get(rack)
        return (
            own.inlet_limit_c
            if own is not None and own.inlet_limit_c is not None
            else (self.inlet_limit_c)
        )

    def inlet_derate_limit(self, rack: str) -> float | None:
        """The inlet-air limit for ``rack`` with its GPUs' power derated (None: not allowed)."""
        own = self.racks.get(rack)
        if own is not None and own.inlet_derate_limit_c is not None:
            return own.inlet_derate_limit_c
        return self.inlet_derate_limit_c

    def supply_limit(self, rack: str) -> float:
        """The configured coolant supply limit for ``rack``'s loop."""
        own = self.racks.get(rack)
        return (
            own.supply_limit_c
            if own is not None and own.supply_limit_c is not None
            else (self.supply_limit_c)
        )

    def trend(self, max_rate_per_min: float | None) -> TrendSettings:
        """Trend settings for one kind of series."""
        return TrendSettings(
            bucket_s=self.trend_bucket_s,
            window_s=self.trend_window_s,
            min_points=self.trend_min_points,
            confidence=self.confidence,
            skill_horizon_s=self.skill_horizon_s,
            skill_margin=self.skill_margin,
            max_rate_per_s=None if max_rate_per_min is None else max_rate_per_min / 60.0,
            settle_s=self.load_settle_s,
        )

    def validate(self) -> Problems:
        """Hysteresis must open the right way; windows must hold enough buckets."""
        if self.exit_margin_c <= self.enter_margin_c:
            yield (
                "exit_margin_c",
                f"exit threshold must be above enter_margin_c ({self.enter_margin_c}) "
                f"so the node leaves the drain on the healthy side, got {self.exit_margin_c}",
            )
        if self.critical_margin_c >= self.enter_margin_c:
            yield (
                "critical_margin_c",
                f"must be below enter_margin_c ({self.enter_margin_c}), "
                f"got {self.critical_margin_c}",
            )
        yield from self._derate_problems()
        buckets = self.trend_window_s / self.trend_bucket_s
        if buckets < self.trend_min_points:
            yield (
                "trend_window_s",
                f"must hold at least trend_min_points ({self.trend_min_points}) buckets of "
                f"trend_bucket_s ({self.trend_bucket_s}), got {self.trend_window_s}",
            )
        if buckets > 120:
            yield (
                "trend_bucket_s",
                f"trend_window_s / trend_bucket_s must be at most 120 (the fit is quadratic "
                f"in the number of buckets), got {buckets:.0f}",
            )
        if self.skill_horizon_s < self.trend_bucket_s:
            yield (
                "skill_horizon_s",
                f"must be at least trend_bucket_s ({self.trend_bucket_s}), "
                f"got {self.skill_horizon_s}",
            )
        elif self.skill_horizon_s > 1000 * self.trend_bucket_s:
            # Each series keeps the forecasts of one horizon pending, one per bucket.
            yield (
                "skill_horizon_s",
                f"must be at most 1000 trend buckets ({1000 * self.trend_bucket_s:g} s), "
                f"got {self.skill_horizon_s}",
            )

    def _derate_problems(self) -> Problems:
        """A derate limit must lie above the inlet limit it relaxes (per rack, as in force)."""
        derate = self.inlet_derate_limit_c
        if derate is not None and derate <= self.inlet_limit_c:
            yield (
                "inlet_derate_limit_c",
                f"must be above inlet_limit_c ({self.inlet_limit_c}), got {derate}",
            )
        for rack, own in sorted(self.racks.items()):
            limit, derate = self.inlet_limit(rack), self.inlet_derate_limit(rack)
            if derate is None or derate > limit:
                continue
            if own.inlet_derate_limit_c is not None:
                yield (
                    f"racks.{rack}.inlet_derate_limit_c",
                    f"must be above the rack's inlet limit in force ({limit}), got {derate}",
                )
            elif own.inlet_limit_c is not None:
                yield (
                    f"racks.{rack}.inlet_limit_c",
                    f"must be below the inlet_derate_limit_c in force ({derate}), got {limit}",
                )
