"""The [policy] table: how decisions are made."""

from __future__ import annotations

from dataclasses import dataclass

from daemon.config.typed_toml import Problems, bounded
from policies.settings import PolicySettings


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """The predictive policy: margins, forecast, cooling-loop evidence, safety limits.

    Thermal margin = slowdown temperature - temperature. Every key is documented in
    systemd/rackguard.example.toml.
    """

    # Margins.
    enter_margin_c: float = bounded(5.0, ge=0, le=50)
    exit_margin_c: float = bounded(10.0, ge=0, le=60)
    critical_margin_c: float = bounded(0.0, ge=-10, le=50)
    shutdown_margin_c: float = bounded(2.0, ge=0, le=20)
    # Timing.
    min_dwell_s: float = bounded(60.0, ge=0)
    resume_after_s: float = bounded(300.0, ge=0)
    stale_after_s: float = bounded(5.0, gt=0)
    rack_stale_after_s: float = bounded(30.0, gt=0)
    evaluate_interval_s: float = bounded(1.0, ge=0.01, le=60)
    # Forecast.
    lead_time_s: float = bounded(600.0, gt=0)
    lead_margin: float = bounded(1.5, ge=1, le=4)
    confidence: float = bounded(0.9, ge=0.6, le=0.999)
    trend_window_s: float = bounded(300.0, gt=0)
    trend_bucket_s: float = bounded(10.0, gt=0)
    trend_min_points: int = bounded(6, ge=3, le=200)
    skill_horizon_s: float = bounded(60.0, gt=0)
    skill_margin: float = bounded(0.2, ge=0, lt=1)
    max_gpu_rate_c_per_min: float = bounded(10.0, gt=0)
    max_air_rate_c_per_min: float = bounded(5.0, gt=0)
    load_step_fraction: float = bounded(0.1, gt=0, le=1)
    load_settle_s: float = bounded(120.0, ge=0)
    # Cooling-loop evidence.
    flow_low_fraction: float = bounded(0.5, gt=0, lt=1)
    supply_rise_c: float = bounded(1.0, gt=0)
    # Safety limits.
    rack_budget_nodes: int = bounded(2, ge=0)
    rack_budget_pct: float = bounded(25.0, ge=0, le=100)
    cluster_budget_nodes: int = bounded(8, ge=0)
    cluster_budget_pct: float = bounded(5.0, ge=0, le=100)
    storm_window_s: float = bounded(600.0, gt=0)
    storm_trips: int = bounded(8, ge=1)
    storm_pct: float = bounded(10.0, ge=0, le=100)
    resumes_per_window: int = bounded(1, ge=1)
    resume_window_s: float = bounded(60.0, gt=0)
    resume_jitter: float = bounded(0.2, ge=0, le=1)
    # Decide and report, but send nothing to the scheduler.
    dry_run: bool = False
    # Record every reading to this trace file for `rackguard replay` ("" = off).
    record_trace: str = ""
    # Rotate the recording to <record_trace>.1 past this size.
    record_max_mb: float = bounded(256.0, gt=0)

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


def policy_settings(cfg: PolicyConfig) -> PolicySettings:
    """The pure policy's settings from the validated config."""
    return PolicySettings(
        enter_margin_c=cfg.enter_margin_c,
        exit_margin_c=cfg.exit_margin_c,
        critical_margin_c=cfg.critical_margin_c,
        shutdown_margin_c=cfg.shutdown_margin_c,
        min_dwell_s=cfg.min_dwell_s,
        resume_after_s=cfg.resume_after_s,
        stale_after_s=cfg.stale_after_s,
        rack_stale_after_s=cfg.rack_stale_after_s,
        lead_time_s=cfg.lead_time_s,
        lead_margin=cfg.lead_margin,
        confidence=cfg.confidence,
        trend_window_s=cfg.trend_window_s,
        trend_bucket_s=cfg.trend_bucket_s,
        trend_min_points=cfg.trend_min_points,
        skill_horizon_s=cfg.skill_horizon_s,
        skill_margin=cfg.skill_margin,
        max_gpu_rate_c_per_min=cfg.max_gpu_rate_c_per_min,
        max_air_rate_c_per_min=cfg.max_air_rate_c_per_min,
        load_step_fraction=cfg.load_step_fraction,
        load_settle_s=cfg.load_settle_s,
        flow_low_fraction=cfg.flow_low_fraction,
        supply_rise_c=cfg.supply_rise_c,
        rack_budget_nodes=cfg.rack_budget_nodes,
        rack_budget_pct=cfg.rack_budget_pct,
        cluster_budget_nodes=cfg.cluster_budget_nodes,
        cluster_budget_pct=cfg.cluster_budget_pct,
        storm_window_s=cfg.storm_window_s,
        storm_trips=cfg.storm_trips,
        storm_pct=cfg.storm_pct,
        resumes_per_window=cfg.resumes_per_window,
        resume_window_s=cfg.resume_window_s,
        resume_jitter=cfg.resume_jitter,
        dry_run=cfg.dry_run,
    )
