"""Every knob of the predictive policy, in one frozen value the daemon's config fills in."""

from __future__ import annotations

from dataclasses import dataclass

from policies.forecast import TrendSettings


@dataclass(frozen=True, slots=True)
class PolicySettings:
    """The policy's settings; validated by the daemon's config (daemon/config/policy.py)."""

    # Thermal margin = slowdown temperature - GPU temperature (both from NVML).
    enter_margin_c: float = 5.0  # drain at or under this margin, forecast or not
    exit_margin_c: float = 10.0  # healthy again only at or above this margin
    critical_margin_c: float = 0.0  # a breach: exclude at once
    shutdown_margin_c: float = 2.0  # this close to the shutdown temperature: exclude at once
    # Timing.
    min_dwell_s: float = 60.0  # least time out of service before a resume
    resume_after_s: float = 300.0  # healthy this long before a resume
    stale_after_s: float = 5.0  # GPU readings older than this are UNKNOWN
    rack_stale_after_s: float = 30.0  # rack readings (PDU, CDU) older than this are UNKNOWN
    # Forecast.
    lead_time_s: float = 600.0  # time a job needs to checkpoint and leave
    lead_margin: float = 1.5  # drain when the earliest plausible breach is within lead x this
    confidence: float = 0.9  # one-sided confidence of trend bounds
    trend_window_s: float = 300.0
    trend_bucket_s: float = 10.0
    trend_min_points: int = 6
    skill_horizon_s: float = 60.0  # horizon at which forecasts are scored against persistence
    skill_margin: float = 0.2  # trust a trend only when its errors are 20 % under persistence's
    max_gpu_rate_c_per_min: float = 10.0  # faster margin changes are steps (load, pump), not trends
    max_air_rate_c_per_min: float = 5.0  # the same for inlet air and coolant temperatures
    load_step_fraction: float = 0.1  # a GPU power change of this x its limit is a load step
    load_settle_s: float = 120.0  # after a step, the trend restarts this much later
    # Cooling-loop evidence.
    flow_low_fraction: float = 0.5  # flow under this x its highest seen: the loop is failing
    supply_rise_c: float = 1.0  # supply this far above its window minimum: rising
    # Safety limits (predictive drains only; critical exclusions ignore them).
    rack_budget_nodes: int = 2  # GPU/node-domain drains per rack: max(nodes, pct of rack)
    rack_budget_pct: float = 25.0
    cluster_budget_nodes: int = 8  # all predictive drains: max(nodes, pct of cluster)
    cluster_budget_pct: float = 5.0
    storm_window_s: float = 600.0  # trips counted over this window ...
    storm_trips: int = 8  # ... open the breaker above max(trips, pct of cluster)
    storm_pct: float = 10.0
    resumes_per_window: int = 1  # at most this many resumes per rack ...
    resume_window_s: float = 60.0  # ... per this window
    resume_jitter: float = 0.2  # each node waits up to this x resume_after_s more (by name)
    dry_run: bool = False

    @property
    def drain_horizon_s(self) -> float:
        """A predicted breach this close (earliest plausible time) drains the node."""
        return self.lead_time_s * self.lead_margin

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
