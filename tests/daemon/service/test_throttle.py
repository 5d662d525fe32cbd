"""Throttled GPU-seconds: from NVML's thermal violation counter and the clock-event reasons."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pynvml
import pytest

from daemon.service.throttle import ThrottleClock
from fakes.nvml import fake_node
from fakes.scheduler import FakeWebhookScheduler
from policies.model import Quality, Reading, SensorKind
from tests.support.daemon_harness import running_daemon
from tests.support.scrape import scrape
from tests.support.wait import wait_for_result

HW_THERMAL, SW_THERMAL, POWER_CAP, IDLE, HW_SLOWDOWN = 0x040, 0x020, 0x004, 0x001, 0x008


def _gpu_reading(
    kind: SensorKind, name: str, unit: str, mono: float, value: float | None, gpu: str, bad: str
) -> Reading:
    return Reading(
        "gpus",
        f"gpu{gpu}.{name}",
        kind,
        value,
        unit,
        Quality.GOOD if value is not None else Quality.BAD,
        mono,
        1e9 + mono,
        reason="" if value is not None else bad,
        labels={"gpu": gpu, "uuid": f"GPU-{gpu}"},
    )


def reasons(mono: float, mask: int | None, gpu: str = "0") -> Reading:
    value = None if mask is None else float(mask)
    kind, lost = SensorKind.GPU_CLOCK_EVENT_REASONS, "NVML_ERROR_GPU_IS_LOST"
    return _gpu_reading(kind, "clock_event_reasons", "bitmask", mono, value, gpu, lost)


def counter(mono: float, seconds: float | None, gpu: str = "0") -> Reading:
    kind, reset = SensorKind.GPU_THERMAL_VIOLATION, "violation counter went backwards by 9.000 s"
    return _gpu_reading(kind, "thermal_violation", "seconds", mono, seconds, gpu, reset)


def test_throttled_seconds_thermal_come_from_the_counter_where_it_reads() -> None:
    clock = ThrottleClock(max_gap_s=10.0)
    clock.observe([reasons(0.0, HW_THERMAL), counter(0.0, 100.0)])  # 100 s before we started
    assert clock.seconds[("0", "GPU-0", "thermal")] == 0.0
    # The counter says 0.4 s of the second; the sampled bits would say all of it.
    clock.observe([reasons(1.0, HW_THERMAL | HW_SLOWDOWN), counter(1.0, 100.4)])
    clock.observe([reasons(2.0, 0), counter(2.0, 101.4)])
    assert clock.seconds[("0", "GPU-0", "thermal")] == pytest.approx(1.4)
    assert clock.seconds[("0", "GPU-0", "hw_slowdown")] == 1.0  # no counter for this bit
    assert ("0", "GPU-0", "hw_thermal_slowdown") not in clock.seconds  # not counted twice


def test_throttled_seconds_across_a_bad_counter_fall_back_to_the_bits_once() -> None:
    clock = ThrottleClock(max_gap_s=10.0)
    clock.observe([reasons(0.0, HW_THERMAL), counter(0.0, 10.0)])
    clock.observe([reasons(1.0, HW_THERMAL), counter(1.0, None)])  # reset: 1 s from the bits
    clock.observe([reasons(2.0, HW_THERMAL), counter(2.0, 1.0)])  # new base: nothing counted
    clock.observe([reasons(3.0, 0), counter(3.0, 1.5)])
    assert clock.seconds[("0", "GPU-0", "hw_thermal_slowdown")] == 1.0
    assert clock.seconds[("0", "GPU-0", "thermal")] == 0.5
    # A GPU without the counter (NOT_SUPPORTED) integrates its bits as before.
    clock.observe([reasons(3.0, HW_THERMAL, gpu="1")])
    clock.observe([reasons(4.0, 0, gpu="1")])
    assert clock.seconds[("1", "GPU-1", "hw_thermal_slowdown")] == 1.0
    assert ("1", "GPU-1", "thermal") not in clock.seconds


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
    nvml.gpus[2].clock_event_reasons = HW_THERMAL
    nvml.gpus[2].errors["nvmlDeviceGetViolationStatus"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    async with running_daemon(nvml, receiver, secret_file) as daemon:

        async def throttled() -> dict[tuple[str, str], float]:
            m = await scrape(daemon.api_port)
            return {
                (lb["gpu"], lb["reason"]): v for lb, v in m["rackguard_gpu_throttled_seconds_total"]
            }

        hot = await wait_for_result(
            throttled,
            lambda t: (
                t.get(("3", "thermal"), 0.0) >= 0.2
                and t.get(("2", "hw_thermal_slowdown"), 0.0) >= 0.2
            ),
            what="0.2 s",
        )
        # Every GPU from its first reading: thermal from the counter, and the two bits
        # it has no counter for; GPU 2 has no counter, so its two thermal bits instead.
        assert len(hot) == 7 * 3 + 4
        assert ("2", "thermal") not in hot and ("3", "hw_thermal_slowdown") not in hot
        counting = {("3", "thermal"), ("2", "hw_thermal_slowdown")}
        assert all(v == 0.0 for k, v in hot.items() if k not in counting)
        nvml.gpus[3].clock_event_reasons = 0
        key = ("3", "thermal")
        await asyncio.sleep(0.3)  # a few polls at 0.05 s: the clear mask is read
        before = (await throttled())[key]
        await asyncio.sleep(0.5)  # ten more polls, none throttled
        assert (await throttled())[key] == before >= hot[key]
