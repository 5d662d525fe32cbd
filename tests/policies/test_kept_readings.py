"""What GpuTracker keeps of its latest readings answers as fresh_value does on the readings."""

from __future__ import annotations

import math
import random

from policies.freshness import fresh_value
from policies.gpu_tracker import GpuTracker
from policies.model import Quality, Reading, SensorKind
from policies.settings import PolicySettings

KINDS = (
    SensorKind.GPU_TEMPERATURE,
    SensorKind.GPU_SLOWDOWN_THRESHOLD,
    SensorKind.GPU_SHUTDOWN_THRESHOLD,
    SensorKind.GPU_POWER,
    SensorKind.GPU_POWER_LIMIT,
)


def _reading(kind: SensorKind, t: float, rng: random.Random) -> Reading:
    if rng.random() < 0.2:
        return Reading(
            "gpus",
            "s",
            kind,
            None,
            "u",
            rng.choice([Quality.BAD, Quality.ABSENT]),
            t,
            t,
            reason="x",
        )
    return Reading(
        "gpus", "s", kind, rng.choice([60.0, 90.0, 95.0, 450.0]), "u", Quality.GOOD, t, t
    )


def test_kept_values_are_fresh_value_of_the_latest_readings() -> None:
    rng = random.Random(3)
    g = GpuTracker(PolicySettings())
    t = 0.0
    for _ in range(3000):
        t += rng.choice([0.5, 1.0, 7.0])
        g.observe(_reading(rng.choice(KINDS), t, rng))
        now = t + rng.choice([0.0, 2.0, 10.0, math.nan])
        for stale in (5.0, 30.0):
            assert g.fresh_temperature(now, stale) == fresh_value(g.temperature, now, stale)
            assert g.fresh_slowdown(now, stale) == fresh_value(g.slowdown, now, stale)
            assert g.fresh_shutdown(now, stale) == fresh_value(g.shutdown, now, stale)
            assert g.fresh_limit(now, stale) == fresh_value(g.limit, now, stale)
