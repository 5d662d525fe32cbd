"""Throttled GPU-seconds: integrated from the clock-event reasons, per GPU and per reason."""

from __future__ import annotations

import asyncio
from pathlib import Path

from daemon.service.throttle import ThrottleClock
from fakes.nvml import fake_node
from fakes.scheduler import FakeWebhookScheduler
from policies.model import Quality, Reading, SensorKind
from tests.support.daemon_harness import running_daemon
from tests.support.scrape import scrape
from tests.support.wait import wait_for_result

HW_THERMAL, SW_THERMAL, POWER_CAP, IDLE = 0x040, 0x020, 0x004, 0x001


def reasons(mono: float, mask: int | None, gpu: str = "0") -> Reading:
    return Reading(
        "gpus",
        f"gpu{gpu}.clock_event_reasons",
        SensorKind.GPU_CLOCK_EVENT_REASONS,
        None if mask is None else float(mask),
        "bitmask",
        Quality.GOOD if mask is not None else Quality.BAD,
        mono,
        1e9 + mono,
        reason="" if mask is not None else "NVML_ERROR_GPU_IS_LOST",
        labels={"gpu": gpu, "uuid": f"GPU-{gpu}"},
    )


def test_throttled_seconds_count_each_reason_for_the_intervals_it_was_set() -> None:
    clock = ThrottleClock(max_gap_s=10.0)
    clock.observe([reasons(0.0, IDLE)])
    assert clock.seconds[("0", "GPU-0", "hw_thermal_slowdown")] == 0.0  # exported from the start
    clock.observe([reasons(1.0, HW_THERMAL | SW_THERMAL)])  # idle is not throttled
    clock.observe([reasons(3.0, HW_THERMAL)])  # 2 s of both
    clock.observe([reasons(4.5, POWER_CAP)])  # 1.5 s more of hw thermal; a power cap is not
    clock.observe([reasons(6.0, 0)])
    assert clock.seconds[("0", "GPU-0", "hw_thermal_slowdown")] == 3.5
    assert clock.seconds[("0", "GPU-0", "sw_thermal_slowdown")] == 2.0
    assert clock.seconds[("0", "GPU-0", "hw_slowdown")] == 0.0
    assert len(clock.seconds) == 4  # only the four heat and power reasons


def test_throttled_seconds_count_nothing_across_a_gap_or_a_bad_reading() -> None:
    clock = ThrottleClock(max_gap_s=10.0)
    clock.observe([reasons(0.0, HW_THERMAL)])
    clock.observe([reasons(30.0, HW_THERMAL)])  # the source was down 30 s: unknown
    clock.observe([reasons(31.0, None)])  # the GPU lost: no mask, and the clock restarts
    clock.observe([reasons(32.0, HW_THERMAL)])
    clock.observe([reasons(33.0, 0), reasons(33.0, HW_THERMAL, gpu="1")])
    assert clock.seconds[("0", "GPU-0", "hw_thermal_slowdown")] == 1.0
    assert clock.seconds[("1", "GPU-1", "hw_thermal_slowdown")] == 0.0


async def test_throttled_seconds_total_is_exported_per_gpu_and_reason(
    receiver: FakeWebhookScheduler, secret_file: Path
) -> None:
    nvml = fake_node()
    for g in nvml.gpus:
        g.temperature_c = 50.0
    nvml.gpus[3].clock_event_reasons = HW_THERMAL
    async with running_daemon(nvml, receiver, secret_file) as daemon:

        async def throttled() -> dict[tuple[str, str], float]:
            m = await scrape(daemon.api_port)
            return {
                (lb["gpu"], lb["reason"]): v for lb, v in m["rackguard_gpu_throttled_seconds_total"]
            }

        hot = await wait_for_result(
            throttled, lambda t: t.get(("3", "hw_thermal_slowdown"), 0.0) >= 0.2, what="0.2 s"
        )
        assert len(hot) == 8 * 4  # every GPU, every reason, from its first reading
        assert all(v == 0.0 for k, v in hot.items() if k != ("3", "hw_thermal_slowdown"))
        nvml.gpus[3].clock_event_reasons = 0
        key = ("3", "hw_thermal_slowdown")
        await asyncio.sleep(0.3)  # a few polls at 0.05 s: the clear mask is read
        before = (await throttled())[key]
        await asyncio.sleep(0.5)  # ten more polls, none throttled
        assert (await throttled())[key] == before >= hot[key]
