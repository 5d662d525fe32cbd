"""The families operators alert and build dashboards on, read at scrape time.

Identity, condition, the policy's per-GPU view, rack evidence, readiness and the
delivery backlog. Every state is a gauge per state (0 or 1) so each series keeps
its identity across transitions; an alert on ``rackguard_node_condition{condition=
"critical"} == 1`` keeps its history through a change of state.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from daemon.version import package_version
from policies.model import Action, Condition, Reading, SensorKind

if TYPE_CHECKING:
    from daemon.http.view import ServiceView

SOURCE_STATES = ("starting", "up", "degraded", "down")


@dataclass(frozen=True, slots=True)
class RackEvidence:
    """The rack as this node's sources see it now; None where nothing fresh says."""

    max_inlet_c: float | None
    coolant_supply_c: float | None
    # Per coolant flow series: the latest value as a fraction of its sustained high.
    flow_fraction: dict[str, float]


def rack_evidence(view: ServiceView, now: float) -> RackEvidence:
    """Highest fresh inlet air and coolant supply, and each flow against its sustained high."""
    stale = view.config.policy.rack_stale_after_s
    fresh = [
        r for r in view.readings() if r.usable and r.value is not None and now - r.mono <= stale
    ]
    tracker = view.rack_tracker()
    fractions: dict[str, float] = {}
    if tracker is not None:
        for key, series in tracker.slow[SensorKind.COOLANT_FLOW].items():
            latest, high = series.latest, series.sustained_high
            if latest is None or not latest.usable or latest.value is None:
                continue
            if now - latest.mono > stale or high is None or high <= 0:
                continue
            fractions[key] = latest.value / high
    return RackEvidence(
        _highest(fresh, SensorKind.INLET_TEMPERATURE),
        _highest(fresh, SensorKind.COOLANT_SUPPLY_TEMPERATURE),
        fractions,
    )


def _highest(readings: Iterable[Reading], kind: SensorKind) -> float | None:
    values = [r.value for r in readings if r.kind is kind and r.value is not None]
    return max(values) if values else None


def driver_versions(readings: Iterable[Reading]) -> list[str]:
    """The NVIDIA driver versions the GPU readings name (one on a healthy node)."""
    found = {
        r.labels["driver_version"]
        for r in readings
        if r.kind is SensorKind.GPU_TEMPERATURE and "driver_version" in r.labels
    }
    return sorted(found)


class NodeCollector(Collector):
    """Builds the operator-facing families from the service's read-only view at scrape time."""

    def __init__(self, view: ServiceView) -> None:
        self._view = view

    def collect(self) -> Iterator[Metric]:
        """Yield every family (the node's own series first)."""
        d = self._view
        node, rack = d.config.node.name, d.config.node.rack or d.rack
        readings = d.readings()
        info = GaugeMetricFamily(
            "rackguard_build_info",
            "Always 1: the agent's version, Python and NVIDIA driver version.",
            labels=["version", "python", "nvml_driver_version"],
        )
        for driver in driver_versions(readings) or [""]:
            info.add_metric([package_version(), platform.python_version(), driver], 1.0)
        yield info
        node_info = GaugeMetricFamily(
            "rackguard_node_info",
            "Always 1: the node this agent guards and its rack (for joins on instance).",
            labels=["node", "rack"],
        )
        node_info.add_metric([node, rack], 1.0)
        yield node_info

        outcome = d.outcome
        condition = outcome.node.condition if outcome is not None else Condition.UNKNOWN
        cond = GaugeMetricFamily(
            "rackguard_node_condition",
            "1 for the node's thermal condition (ok, warning, critical, unknown), else 0.",
            labels=["node", "condition"],
        )
        for c in Condition:
            cond.add_metric([node, c.value], 1.0 if c is condition else 0.0)
        yield cond

        action = d.node_action
        act = GaugeMetricFamily(
            "rackguard_node_action",
            "1 for what rackguard last asked for the node (resume = in service), else 0.",
            labels=["node", "action"],
        )
        for a in Action:
            act.add_metric([node, a.value], 1.0 if a is action else 0.0)
        yield act

        # The same test as /readyz, so the alert and the probe agree.
        yield GaugeMetricFamily(
            "rackguard_ready",
            "1 while /readyz says ready: every source has reported, the outbox and the "
            "delivery are healthy.",
            value=1.0 if d.readiness().ready else 0.0,
        )
        yield GaugeMetricFamily(
            "rackguard_storm_breaker_open",
            "1 while the storm breaker holds predictive drains until an operator reset.",
            value=1.0 if d.breaker_open else 0.0,
        )

        health = GaugeMetricFamily(
            "rackguard_source_health",
            "1 for the source's health state (starting, up, degraded, down), else 0.",
            labels=["source", "health"],
        )
        for source in d.sources():
            for state in SOURCE_STATES:
                health.add_metric([source.name, state], 1.0 if source.health == state else 0.0)
        yield health

        yield from _gpu_families(d)
        yield from _rack_families(d, rack)
        yield from _backlog_families(d)


def _gpu_families(d: ServiceView) -> Iterator[Metric]:
    throttled = CounterMetricFamily(
        "rackguard_gpu_throttled_seconds",
        "Seconds the GPU ran with its clocks cut, by reason: thermal from NVML's thermal"
        " violation counter where the GPU has one, else sw_thermal_slowdown and"
        " hw_thermal_slowdown from the clock-event reasons; hw_slowdown and"
        " hw_power_brake_slowdown from the clock-event reasons. The outcome rackguard"
        " exists to keep at zero.",
        labels=["gpu", "uuid", "reason"],
    )
    for (gpu, uuid, reason), seconds in sorted(d.throttled_seconds().items()):
        throttled.add_metric([gpu, uuid, reason], seconds)
    yield throttled

    slowdown = GaugeMetricFamily(
        "rackguard_gpu_slowdown_temperature_celsius",
        "The GPU's slowdown (throttle) temperature, as NVML reports it.",
        labels=["gpu", "uuid"],
    )
    now = time.monotonic()
    stale = d.config.policy.stale_after_s
    for r in d.readings():
        kind_ok = r.kind is SensorKind.GPU_SLOWDOWN_THRESHOLD and r.usable
        if kind_ok and r.value is not None and now - r.mono <= stale:
            slowdown.add_metric([r.labels.get("gpu", ""), r.labels.get("uuid", "")], r.value)
    yield slowdown

    ttt = GaugeMetricFamily(
        "rackguard_gpu_time_to_slowdown_seconds",
        "Forecast seconds until the GPU's margin reaches the critical margin; absent when "
        "no trusted forecast says it will.",
        labels=["gpu"],
    )
    trend = GaugeMetricFamily(
        "rackguard_gpu_temperature_trend_celsius_per_second",
        "The GPU temperature's trusted trend (absent while the trend is not trusted).",
        labels=["gpu"],
    )
    condition = GaugeMetricFamily(
        "rackguard_gpu_condition",
        "1 for the GPU's thermal condition (ok, warning, critical, unknown), else 0.",
        labels=["gpu", "condition"],
    )
    outcome = d.outcome
    for a in outcome.gpus if outcome is not None else ():
        gpu = a.subject.removeprefix("gpu")
        if a.time_to_threshold_s is not None:
            ttt.add_metric([gpu], a.time_to_threshold_s)
        if a.trend_per_min is not None:
            trend.add_metric([gpu], a.trend_per_min / 60.0)
        for c in Condition:
            condition.add_metric([gpu, c.value], 1.0 if c is a.condition else 0.0)
    yield ttt
    yield trend
    yield condition


def _rack_families(d: ServiceView, rack: str) -> Iterator[Metric]:
    ev = rack_evidence(d, time.monotonic())
    inlet = GaugeMetricFamily(
        "rackguard_rack_inlet_max_celsius",
        "The hottest fresh rack inlet air probe.",
        labels=["rack"],
    )
    if ev.max_inlet_c is not None:
        inlet.add_metric([rack], ev.max_inlet_c)
    yield inlet
    supply = GaugeMetricFamily(
        "rackguard_rack_coolant_supply_celsius",
        "The highest fresh coolant supply temperature.",
        labels=["rack"],
    )
    if ev.coolant_supply_c is not None:
        supply.add_metric([rack], ev.coolant_supply_c)
    yield supply
    flow = GaugeMetricFamily(
        "rackguard_coolant_flow_sustained_high_ratio",
        "Coolant flow as a fraction of the highest level it held over the last 30 minutes.",
        labels=["rack", "series"],
    )
    for key, fraction in sorted(ev.flow_fraction.items()):
        flow.add_metric([rack, key], fraction)
    yield flow


def _backlog_families(d: ServiceView) -> Iterator[Metric]:
    pending = d.pending()
    oldest = min((p.queued_at for p in pending), default=None)
    yield GaugeMetricFamily(
        "rackguard_outbox_oldest_pending_age_seconds",
        "Age of the oldest decision the scheduler has not confirmed (0 with none pending).",
        value=max(0.0, time.time() - oldest) if oldest is not None else 0.0,
    )
    yield GaugeMetricFamily(
        "rackguard_delivery_undeliverable",
        "Decisions still undelivered [scheduler] undeliverable_after_s after they were made"
        " (each one makes /readyz not ready).",
        value=len(d.undeliverable()),
    )
    yield GaugeMetricFamily(
        "rackguard_outbox_pending_retrying",
        "Pending decisions whose last delivery attempt failed.",
        value=sum(1 for p in pending if p.attempts > 0 and p.last_error),
    )
