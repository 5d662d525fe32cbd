"""Prometheus metrics: gauges read from the daemon's state at scrape time.

Only the poll-duration histogram and the decision counter are updated as things
happen; every other family is built from the latest readings when /metrics is
scraped, so the poll path pays nothing for them. One registry per daemon (the
demo runs several daemons in one process).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from daemon.http.node_metrics import NodeCollector
from policies.model import Decision, Reading, SensorKind

if TYPE_CHECKING:
    from daemon.http.view import ServiceView
    from daemon.service.runner import SourceRunner

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# (metric name, help, label names, how to get the label values from a reading)
_LabelFn = Callable[[Reading], list[str]]
_FAMILIES: dict[SensorKind, tuple[str, str, list[str], _LabelFn]] = {
    SensorKind.GPU_TEMPERATURE: (
        "rackguard_gpu_temperature_celsius",
        "GPU core temperature.",
        ["gpu", "uuid"],
        lambda r: [r.labels.get("gpu", ""), r.labels.get("uuid", "")],
    ),
    SensorKind.GPU_MEMORY_TEMPERATURE: (
        "rackguard_gpu_memory_temperature_celsius",
        "GPU memory (HBM) temperature.",
        ["gpu", "uuid"],
        lambda r: [r.labels.get("gpu", ""), r.labels.get("uuid", "")],
    ),
    SensorKind.GPU_POWER: (
        "rackguard_gpu_power_watts",
        "GPU power draw.",
        ["gpu", "uuid"],
        lambda r: [r.labels.get("gpu", ""), r.labels.get("uuid", "")],
    ),
    SensorKind.GPU_POWER_LIMIT: (
        "rackguard_gpu_power_limit_watts",
        "GPU enforced power limit.",
        ["gpu", "uuid"],
        lambda r: [r.labels.get("gpu", ""), r.labels.get("uuid", "")],
    ),
    SensorKind.INLET_TEMPERATURE: (
        "rackguard_inlet_temperature_celsius",
        "Rack inlet air temperature by probe.",
        ["pdu", "probe"],
        lambda r: [r.source, r.labels.get("probe", r.sensor)],
    ),
    SensorKind.COOLANT_SUPPLY_TEMPERATURE: (
        "rackguard_coolant_supply_temperature_celsius",
        "Coolant supply temperature.",
        ["source"],
        lambda r: [r.source],
    ),
    SensorKind.COOLANT_RETURN_TEMPERATURE: (
        "rackguard_coolant_return_temperature_celsius",
        "Coolant return temperature.",
        ["source"],
        lambda r: [r.source],
    ),
    SensorKind.COOLANT_FLOW: (
        "rackguard_coolant_flow_liters_per_minute",
        "Coolant flow.",
        ["source"],
        lambda r: [r.source],
    ),
}


class _StateCollector(Collector):
    """Builds the gauge families from the daemon's latest state."""

    def __init__(self, view: ServiceView) -> None:
        self._view = view

    def collect(self) -> Iterator[Metric]:
        """Yield every family; BAD, UNCERTAIN and stale readings are left out."""
        v = self._view
        # Every family, even with no series: a node without a PDU or CDU still
        # describes them, so dashboards and rules can be checked against any agent.
        families = {
            kind: GaugeMetricFamily(name, doc, labels=labels)
            for kind, (name, doc, labels, _) in _FAMILIES.items()
        }
        margin = GaugeMetricFamily(
            "rackguard_gpu_thermal_margin_celsius",
            "Slowdown temperature minus GPU temperature.",
            labels=["gpu", "uuid"],
        )
        slowdown: dict[tuple[str, str], float] = {}
        temps: dict[tuple[str, str], float] = {}
        now = time.monotonic()
        policy = v.config.policy
        gpu_stale = policy.stale_after_s
        rack_stale = policy.rack_stale_after_s
        for r in v.readings():
            if not r.usable or r.value is None:
                continue
            # A source that stopped reporting must not look frozen and healthy:
            # its series leave the scrape once stale (rackguard_source_up says why).
            limit = gpu_stale if r.kind.value.startswith("gpu_") else rack_stale
            if now - r.mono > limit:
                continue
            key = (r.labels.get("gpu", ""), r.labels.get("uuid", ""))
            if r.kind is SensorKind.GPU_SLOWDOWN_THRESHOLD:
                slowdown[key] = r.value
            elif r.kind is SensorKind.GPU_TEMPERATURE:
                temps[key] = r.value
            spec = _FAMILIES.get(r.kind)
            if spec is None:
                continue
            families[r.kind].add_metric(spec[3](r), r.value)
        for key, temp in temps.items():
            if key in slowdown:
                margin.add_metric(list(key), slowdown[key] - temp)
        yield from families.values()
        yield margin

        # One series per source whatever its state (rackguard_source_health has the state).
        up = GaugeMetricFamily(
            "rackguard_source_up",
            "1 when the source's last poll succeeded.",
            labels=["source"],
        )
        for source in v.sources():
            up.add_metric([source.name], 1.0 if source.health == "up" else 0.0)
        yield up

        ttt = GaugeMetricFamily(
            "rackguard_time_to_threshold_seconds",
            "Forecast time until a subject reaches its threshold.",
            labels=["subject", "domain"],
        )
        outcome = v.outcome
        if outcome is not None:
            for a in (outcome.node, *outcome.gpus):
                if a.time_to_threshold_s is not None:
                    ttt.add_metric([a.subject, a.domain.value], a.time_to_threshold_s)
        yield ttt

        yield GaugeMetricFamily(
            "rackguard_outbox_pending",
            "Decisions waiting for the scheduler to confirm them.",
            value=v.pending_count(),
        )
        yield from _delivery_families(v)
        yield from _notice_families(v)


# Label values known in advance, exported at 0 so rate() works from the first event.
_NOTICE_ACTIONS = ("drain", "exclude")
_JOB_RESULTS = ("done", "gone", "refused")


def _notice_families(v: ServiceView) -> Iterator[Metric]:
    """The job notices: opened, still open, signals and requeues by result, retried steps."""
    opened = CounterMetricFamily(
        "rackguard_job_notices",
        "Job notices opened (a drain or an exclusion applied), by action.",
        labels=["scheduler", "action"],
    )
    pending = GaugeMetricFamily(
        "rackguard_job_notices_pending",
        "Job notices still open: running jobs to tell, or to requeue at the deadline.",
        labels=["scheduler"],
    )
    signals = CounterMetricFamily(
        "rackguard_job_signals",
        "Signals to running jobs, by result (done; gone: the job had ended; refused; "
        "unknown: in flight at a crash, not sent again).",
        labels=["scheduler", "result"],
    )
    requeues = CounterMetricFamily(
        "rackguard_job_requeues",
        "Requeues of jobs still running at the deadline, by result "
        "(refused: the job cannot be requeued and is left running).",
        labels=["scheduler", "result"],
    )
    retries = CounterMetricFamily(
        "rackguard_job_notice_retries",
        "Notice steps that failed and will be retried, by reason "
        "(unreachable, auth, refused, not_found, storage).",
        labels=["scheduler", "reason"],
    )
    notices = v.notices
    if notices is not None:
        name, counts = notices.scheduler, notices.counts
        for action in sorted({*_NOTICE_ACTIONS, *counts.opened}):
            opened.add_metric([name, action], counts.opened[action])
        pending.add_metric([name], notices.open_count())
        for result in sorted({*_JOB_RESULTS, *counts.signals}):
            signals.add_metric([name, result], counts.signals[result])
        for result in sorted({*_JOB_RESULTS, *counts.requeues}):
            requeues.add_metric([name, result], counts.requeues[result])
        for reason, n in sorted(counts.retries.items()):
            retries.add_metric([name, reason], n)
    yield from (opened, pending, signals, requeues, retries)


def _delivery_families(v: ServiceView) -> Iterator[Metric]:
    yield GaugeMetricFamily(
        "rackguard_outbox_writable",
        "1 while the outbox's disk takes writes; 0 while decisions are held in memory only.",
        value=0.0 if v.storage_error else 1.0,
    )
    yield GaugeMetricFamily(
        "rackguard_outbox_not_durable",
        "Decision changes held in memory only, waiting for the disk.",
        value=v.not_durable(),
    )
    writes = CounterMetricFamily(
        "rackguard_outbox_write_failures", "Outbox write transactions the disk refused."
    )
    writes.add_metric([], v.write_failures)
    yield writes
    failures = CounterMetricFamily(
        "rackguard_delivery_failures",
        "Failed delivery attempts, by reason (unreachable, auth, not_found, refused, malformed).",
        labels=["reason"],
    )
    for reason, n in sorted(v.delivery_failures().items()):
        failures.add_metric([reason], n)
    yield failures


class Metrics:
    """The daemon's registry and the two families updated as events happen."""

    def __init__(self, view: ServiceView) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_StateCollector(view))
        self.registry.register(NodeCollector(view))
        ProcessCollector(registry=self.registry)  # process_cpu_seconds_total, memory, fds
        self.poll_duration = Histogram(
            "rackguard_poll_duration_seconds",
            "Duration of one poll of a source (connect + read).",
            ["source"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
            registry=self.registry,
        )
        self.decisions = Counter(
            "rackguard_decisions",
            "Decisions made, by action and fault domain.",
            ["action", "domain"],
            registry=self.registry,
        )

    def observe_poll(self, runner: SourceRunner, duration_s: float) -> None:
        """Record one poll attempt's duration."""
        self.poll_duration.labels(runner.name).observe(duration_s)

    def count_decision(self, decision: Decision) -> None:
        """Count one decision."""
        self.decisions.labels(decision.action.value, decision.domain.value).inc()

    def render(self) -> bytes:
        """The text exposition format."""
        return generate_latest(self.registry)
