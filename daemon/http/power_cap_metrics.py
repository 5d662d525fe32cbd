"""The power-cap families: what the GPUs' power-management limits are, from the limiter.

The enforced limit is already ``rackguard_gpu_power_limit_watts`` (the NVML
source's reading). These add what only the limit calls say: the limit someone set
below the GPU's default (a cap, rackguard's or an administrator's) and the range
a cap may take.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from adapters.sensors.power_limit import GpuLimit


class PowerCapCollector(Collector):
    """Builds the families at scrape time from ``latest()``, the limiter's last read."""

    def __init__(self, latest: Callable[[], Sequence[GpuLimit]]) -> None:
        self._latest = latest

    def collect(self) -> Iterator[Metric]:
        """Yield the three families (described even with no GPU read yet)."""
        labels = ["gpu", "uuid"]
        cap = GaugeMetricFamily(
            "rackguard_gpu_power_cap_watts",
            "The GPU's power-management limit while it is below the GPU's default (a cap,"
            " set by rackguard or an administrator); absent when not capped.",
            labels=labels,
        )
        default = GaugeMetricFamily(
            "rackguard_gpu_power_limit_default_watts",
            "The GPU's default power limit: the highest rackguard ever sets.",
            labels=labels,
        )
        minimum = GaugeMetricFamily(
            "rackguard_gpu_power_limit_min_watts",
            "The lowest power limit NVML accepts for the GPU.",
            labels=labels,
        )
        for g in self._latest():
            values = [str(g.index), g.uuid]
            if g.requested_w < g.default_w:
                cap.add_metric(values, g.requested_w)
            default.add_metric(values, g.default_w)
            minimum.add_metric(values, g.min_w)
        yield cap
        yield default
        yield minimum
