"""The cap rung's families: who set each GPU's cap, and the GPU-seconds under rackguard's caps.

``rackguard_gpu_power_cap_watts`` (daemon/http/power_cap_metrics.py) says a GPU is
capped; these say by whom and for how long, from :class:`PowerCaps`.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from daemon.service.power_cap import PowerCaps


class CapLadderCollector(Collector):
    """Built at scrape time from the applier's status and counters."""

    def __init__(self, caps: PowerCaps) -> None:
        self._caps = caps

    def collect(self) -> Iterator[Metric]:
        """Yield the families (described even with no GPU capped)."""
        by = GaugeMetricFamily(
            "rackguard_gpu_power_cap_set_by",
            "1 for the actor whose cap the GPU's power-management limit is: rackguard"
            " (its ladder) or other (an administrator or another tool).",
            labels=["gpu", "set_by"],
        )
        for row in self._caps.status():
            if row.set_by:
                by.add_metric([str(row.gpu), row.set_by], 1.0)
        seconds = CounterMetricFamily(
            "rackguard_gpu_capped_seconds",
            "Seconds each GPU has spent under a power cap rackguard set (since start).",
            labels=["gpu"],
        )
        for gpu, s in sorted(self._caps.capped_seconds.items()):
            seconds.add_metric([gpu], s)
        failed = CounterMetricFamily(
            "rackguard_gpu_power_cap_failures",
            "Power limits rackguard decided but could not set (the drain goes ahead).",
        )
        failed.add_metric([], float(self._caps.failures))
        yield by
        yield seconds
        yield failed
