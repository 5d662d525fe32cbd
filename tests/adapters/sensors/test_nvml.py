"""NvmlAdapter against the fake NVML binding: every field, every error path, the thread rule."""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import AsyncIterator, Sequence

import pynvml
import pytest

from adapters.errors import SourceSetupError, SourceUnavailable
from adapters.sensors.nvml import NvmlAdapter, decode_clock_event_reasons, load_binding
from fakes.gpus import A100_SXM4, H100_SXM, GpuModel, make_gpus
from fakes.nvml import FUNCTIONS, FakeNvml, fake_node, field_error_key
from policies.model import Quality, Reading, SensorKind

GPUS = 4
PER_GPU = 9
MEMORY_TEMP_KEY = field_error_key(pynvml.NVML_FI_DEV_MEMORY_TEMP)

SENSORS: dict[str, tuple[SensorKind, str]] = {
    "temperature": (SensorKind.GPU_TEMPERATURE, "celsius"),
    "memory_temperature": (SensorKind.GPU_MEMORY_TEMPERATURE, "celsius"),
    "slowdown_threshold": (SensorKind.GPU_SLOWDOWN_THRESHOLD, "celsius"),
    "shutdown_threshold": (SensorKind.GPU_SHUTDOWN_THRESHOLD, "celsius"),
    "max_operating_threshold": (SensorKind.GPU_MAX_OPERATING_THRESHOLD, "celsius"),
    "power": (SensorKind.GPU_POWER, "watts"),
    "power_limit": (SensorKind.GPU_POWER_LIMIT, "watts"),
    "clock_event_reasons": (SensorKind.GPU_CLOCK_EVENT_REASONS, "bitmask"),
    "thermal_violation": (SensorKind.GPU_THERMAL_VIOLATION, "seconds"),
}


@pytest.fixture
def fake() -> FakeNvml:
    """Four H100s with the fake's default state."""
    return fake_node(H100_SXM, count=GPUS)


@pytest.fixture
async def adapter(fake: FakeNvml) -> AsyncIterator[NvmlAdapter]:
    """A connected adapter over `fake`, closed after the test."""
    nvml = NvmlAdapter("nvml", fake)
    await nvml.connect()
    yield nvml
    await nvml.close()


def by_sensor(readings: Sequence[Reading]) -> dict[str, Reading]:
    """Readings keyed by sensor id, asserting ids are unique."""
    keyed = {r.sensor: r for r in readings}
    assert len(keyed) == len(readings)
    return keyed


async def wait_idle(nvml: NvmlAdapter, limit_s: float = 5.0) -> None:
    """Wait until an abandoned NVML call has finished."""
    deadline = time.monotonic() + limit_s
    while nvml.busy:
        assert time.monotonic() < deadline, "the abandoned NVML call never finished"
        await asyncio.sleep(0.005)


def assert_bad(reading: Reading, *needles: str) -> None:
    """BAD, no value, and the reason names every needle."""
    assert reading.quality is Quality.BAD
    assert reading.value is None
    for needle in needles:
        assert needle in reading.reason


# --- every field ------------------------------------------------------------------------


async def test_every_field_matches_the_gpu_state(fake: FakeNvml, adapter: NvmlAdapter) -> None:
    for i, gpu in enumerate(fake.gpus):
        gpu.temperature_c = 41.0 + i
        gpu.memory_temperature_c = 55.0 + i
        gpu.power_w = 312.5 + i
        gpu.power_limit_w = 650.0 - i
        gpu.clock_event_reasons = 0x20 if i == 2 else 0

    readings = await adapter.read()

    assert len(readings) == GPUS * PER_GPU
    keyed = by_sensor(readings)
    for i, gpu in enumerate(fake.gpus):
        expected = {
            "temperature": 41.0 + i,
            "memory_temperature": 55.0 + i,
            "slowdown_threshold": 90.0,
            "shutdown_threshold": 92.0,
            "max_operating_threshold": 87.0,
            "power": 312.5 + i,
            "power_limit": 650.0 - i,
            "clock_event_reasons": 32.0 if i == 2 else 0.0,
            "thermal_violation": 0.0,
        }
        if i == 2:  # throttled: its counter grew while the read ran
            del expected["thermal_violation"]
        for suffix, value in expected.items():
            reading = keyed[f"gpu{i}.{suffix}"]
            assert reading.value == value, reading.sensor
            assert (reading.kind, reading.unit) == SENSORS[suffix]
            assert reading.quality is Quality.GOOD
            assert reading.reason == ""
            assert reading.source == "nvml"
            assert reading.key == f"nvml/gpu{i}.{suffix}"
            assert reading.labels["gpu"] == str(i)
            assert reading.labels["uuid"] == gpu.uuid
            assert reading.labels["pci_bus_id"] == gpu.pci_bus_id
            assert reading.labels["name"] == "NVIDIA H100 80GB HBM3"
    assert keyed["gpu2.clock_event_reasons"].labels["active"] == "sw_thermal_slowdown"
    assert keyed["gpu0.clock_event_reasons"].labels["active"] == ""


async def test_sensor_ids_and_order_per_gpu(adapter: NvmlAdapter) -> None:
    readings = await adapter.read()
    assert [r.sensor for r in readings[:PER_GPU]] == [f"gpu0.{s}" for s in SENSORS]
    assert [r.sensor for r in readings[-PER_GPU:]] == [f"gpu3.{s}" for s in SENSORS]


async def test_values_track_the_gpu_between_reads(fake: FakeNvml, adapter: NvmlAdapter) -> None:
    fake.gpus[1].temperature_c = 60.4
    first = by_sensor(await adapter.read())["gpu1.temperature"]
    fake.gpus[1].temperature_c = 71.6
    second = by_sensor(await adapter.read())["gpu1.temperature"]
    assert (first.value, second.value) == (60.0, 72.0)  # NVML reports whole degrees
    assert second.mono > first.mono


async def test_one_timestamp_per_read(adapter: NvmlAdapter) -> None:
    mono0, wall0 = time.monotonic(), time.time()
    readings = await adapter.read()
    mono1, wall1 = time.monotonic(), time.time()
    assert len({(r.mono, r.wall) for r in readings}) == 1
    assert mono0 <= readings[0].mono <= mono1
    assert wall0 <= readings[0].wall <= wall1


async def test_memory_temperature_carries_the_device_timestamp(adapter: NvmlAdapter) -> None:
    before = time.time()
    reading = by_sensor(await adapter.read())["gpu0.memory_temperature"]
    assert reading.device_ts is not None
    assert before - 1 <= reading.device_ts <= time.time() + 1


@pytest.mark.parametrize(
    "model",
    [
        H100_SXM,
        A100_SXM4,
        GpuModel("odd", slowdown_c=77, shutdown_c=99, max_operating_c=70, memory_max_c=80,
                 power_limit_w=300.0, idle_power_w=30.0),
    ],
    ids=["h100", "a100", "odd"],
)  # fmt: skip
async def test_thresholds_and_limit_come_from_the_model(model: GpuModel) -> None:
    nvml = NvmlAdapter("nvml", fake_node(model, count=2))
    await nvml.connect()
    try:
        keyed = by_sensor(await nvml.read())
    finally:
        await nvml.close()
    for i in range(2):
        assert keyed[f"gpu{i}.slowdown_threshold"].value == model.slowdown_c
        assert keyed[f"gpu{i}.shutdown_threshold"].value == model.shutdown_c
        assert keyed[f"gpu{i}.max_operating_threshold"].value == model.max_operating_c
        assert keyed[f"gpu{i}.power_limit"].value == model.power_limit_w
        assert keyed[f"gpu{i}.temperature"].labels["name"] == model.name


async def test_thresholds_and_identity_are_read_once_and_again_on_reconnect(
    fake: FakeNvml, adapter: NvmlAdapter
) -> None:
    assert fake.calls["nvmlDeviceGetTemperatureThreshold"] == 3 * GPUS
    assert fake.calls["nvmlDeviceGetUUID"] == GPUS
    fake.gpus[0].model = A100_SXM4
    for _ in range(3):
        keyed = by_sensor(await adapter.read())
    assert keyed["gpu0.slowdown_threshold"].value == H100_SXM.slowdown_c  # cached
    assert keyed["gpu0.temperature"].labels["name"] == H100_SXM.name
    assert fake.calls["nvmlDeviceGetTemperatureThreshold"] == 3 * GPUS
    assert fake.calls["nvmlDeviceGetUUID"] == GPUS

    await adapter.connect()  # reconnect re-reads
    keyed = by_sensor(await adapter.read())
    assert keyed["gpu0.slowdown_threshold"].value == A100_SXM4.slowdown_c
    assert keyed["gpu0.temperature"].labels["name"] == A100_SXM4.name
    assert fake.calls["nvmlDeviceGetTemperatureThreshold"] == 6 * GPUS
    assert fake.calls["nvmlInit"] == 2
    assert fake.calls["nvmlShutdown"] == 1


async def test_threshold_failed_at_connect_stays_bad(fake: FakeNvml) -> None:
    fake.gpus[1].errors["nvmlDeviceGetTemperatureThreshold"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    nvml = NvmlAdapter("nvml", fake)
    await nvml.connect()
    try:
        del fake.gpus[1].errors["nvmlDeviceGetTemperatureThreshold"]
        for _ in range(2):
            keyed = by_sensor(await nvml.read())
            for suffix in ("slowdown_threshold", "shutdown_threshold", "max_operating_threshold"):
                assert_bad(keyed[f"gpu1.{suffix}"], "NVML_ERROR_NOT_SUPPORTED")
                assert keyed[f"gpu0.{suffix}"].quality is Quality.GOOD
            assert keyed["gpu1.temperature"].quality is Quality.GOOD
    finally:
        await nvml.close()


async def test_threshold_that_failed_transiently_is_read_again(fake: FakeNvml) -> None:
    fake.gpus[1].errors["nvmlDeviceGetTemperatureThreshold"] = pynvml.NVML_ERROR_UNKNOWN
    nvml = NvmlAdapter("nvml", fake)
    await nvml.connect()
    try:
        keyed = by_sensor(await nvml.read())
        assert_bad(keyed["gpu1.slowdown_threshold"], "NVML_ERROR_UNKNOWN")
        del fake.gpus[1].errors["nvmlDeviceGetTemperatureThreshold"]
        keyed = by_sensor(await nvml.read())  # no reconnect needed
        assert keyed["gpu1.slowdown_threshold"].value == H100_SXM.slowdown_c
        calls = fake.calls["nvmlDeviceGetTemperatureThreshold"]
        await nvml.read()
        assert fake.calls["nvmlDeviceGetTemperatureThreshold"] == calls  # cached again
    finally:
        await nvml.close()


async def test_old_pynvml_bytes_are_decoded() -> None:
    fake = FakeNvml(make_gpus(H100_SXM, 2), strings_as_bytes=True)
    nvml = NvmlAdapter("nvml", fake)
    await nvml.connect()
    try:
        labels = (await nvml.read())[PER_GPU].labels
    finally:
        await nvml.close()
    assert labels["uuid"] == fake.gpus[1].uuid
    assert labels["pci_bus_id"] == fake.gpus[1].pci_bus_id
    assert labels["name"] == H100_SXM.name


@pytest.mark.parametrize("fn", ["nvmlDeviceGetUUID", "nvmlDeviceGetPciInfo", "nvmlDeviceGetName"])
async def test_identity_that_fails_is_labelled_unknown(fake: FakeNvml, fn: str) -> None:
    fake.gpus[0].errors[fn] = pynvml.NVML_ERROR_NOT_SUPPORTED
    nvml = NvmlAdapter("nvml", fake)
    await nvml.connect()
    try:
        keyed = by_sensor(await nvml.read())
    finally:
        await nvml.close()
    labels = keyed["gpu0.temperature"].labels
    label = {"nvmlDeviceGetUUID": "uuid", "nvmlDeviceGetPciInfo": "pci_bus_id"}.get(fn, "name")
    assert labels[label] == "unknown"
    assert sum(v == "unknown" for v in labels.values()) == 1
    assert keyed["gpu0.temperature"].quality is Quality.GOOD


def test_decode_clock_event_reasons() -> None:
    assert decode_clock_event_reasons(0) == ""
    assert decode_clock_event_reasons(0x28) == "hw_slowdown,sw_thermal_slowdown"
    assert decode_clock_event_reasons(0x44) == "sw_power_cap,hw_thermal_slowdown"
    assert decode_clock_event_reasons(0x1 | 0x80) == "gpu_idle,hw_power_brake_slowdown"
    assert decode_clock_event_reasons(0x10008) == "hw_slowdown,unknown_0x10000"


@pytest.mark.parametrize(
    ("mask", "active"),
    [(0, ""), (0x28, "hw_slowdown,sw_thermal_slowdown"), (0x4, "sw_power_cap")],
)
async def test_clock_event_reasons_label(
    fake: FakeNvml, adapter: NvmlAdapter, mask: int, active: str
) -> None:
    fake.gpus[3].clock_event_reasons = mask
    reading = by_sensor(await adapter.read())["gpu3.clock_event_reasons"]
    assert reading.value == float(mask)
    assert reading.labels["active"] == active
    assert reading.labels["uuid"] == fake.gpus[3].uuid


# --- error paths ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fn", "suffix"),
    [
        ("nvmlDeviceGetTemperature", "temperature"),
        ("nvmlDeviceGetFieldValues", "memory_temperature"),
        ("nvmlDeviceGetPowerUsage", "power"),
        ("nvmlDeviceGetEnforcedPowerLimit", "power_limit"),
        ("nvmlDeviceGetCurrentClocksEventReasons", "clock_event_reasons"),
    ],
)
@pytest.mark.parametrize(
    ("code", "name"),
    [
        (pynvml.NVML_ERROR_NOT_SUPPORTED, "NVML_ERROR_NOT_SUPPORTED"),
        (pynvml.NVML_ERROR_UNKNOWN, "NVML_ERROR_UNKNOWN"),
        (pynvml.NVML_ERROR_NO_PERMISSION, "NVML_ERROR_NO_PERMISSION"),
        (pynvml.NVML_ERROR_TIMEOUT, "NVML_ERROR_TIMEOUT"),
    ],
)
async def test_one_failing_field_is_one_bad_reading(
    fake: FakeNvml, adapter: NvmlAdapter, fn: str, suffix: str, code: int, name: str
) -> None:
    fake.gpus[2].errors[fn] = code
    readings = await adapter.read()
    keyed = by_sensor(readings)
    assert_bad(keyed[f"gpu2.{suffix}"], name)
    # gpu0 resolved the clock call already, so gpu2 gets no fallback: one BAD reading.
    assert [r.sensor for r in readings if r.quality is not Quality.GOOD] == [f"gpu2.{suffix}"]


# --- the thermal violation counter -------------------------------------------------------

THERMAL = pynvml.NVML_PERF_POLICY_THERMAL


async def test_throttled_thermal_violation_is_nvml_ns_as_seconds_with_the_reference_time(
    fake: FakeNvml, adapter: NvmlAdapter
) -> None:
    fake.gpus[1].violation_ns[THERMAL] = 2_500_000_000
    wall0 = time.time()
    reading = by_sensor(await adapter.read())["gpu1.thermal_violation"]
    assert (reading.value, reading.quality, reading.unit) == (2.5, Quality.GOOD, "seconds")
    assert reading.device_ts is not None and wall0 - 1 <= reading.device_ts <= time.time() + 1


async def test_throttled_thermal_violation_counts_while_the_thermal_bits_are_set(
    fake: FakeNvml, adapter: NvmlAdapter
) -> None:
    await adapter.read()
    fake.gpus[0].clock_event_reasons = 0x040  # hw thermal slowdown
    fake.gpus[1].clock_event_reasons = 0x004  # a power cap: the power policy, not thermal
    await adapter.read()
    await asyncio.sleep(0.3)
    keyed = by_sensor(await adapter.read())
    assert 0.25 <= (keyed["gpu0.thermal_violation"].value or 0.0) <= 1.0
    assert keyed["gpu1.thermal_violation"].value == 0.0


@pytest.mark.parametrize(
    ("after_ns", "needle"),
    [
        (1_000_000_000, "went backwards by 4.000 s"),  # a driver reload resets it
        (5_000_000_000 + 100 * 10**9, "advanced 100.000 s in"),  # more than the time passed
        (2**64 - 1, "of wall time"),  # garbage
    ],
)
async def test_throttled_thermal_violation_that_cannot_be_true_is_bad_then_rebased(
    fake: FakeNvml, adapter: NvmlAdapter, after_ns: int, needle: str
) -> None:
    gpu = fake.gpus[3]
    gpu.violation_ns[THERMAL] = 5_000_000_000
    assert by_sensor(await adapter.read())["gpu3.thermal_violation"].value == 5.0
    gpu.violation_ns[THERMAL] = after_ns
    assert_bad(by_sensor(await adapter.read())["gpu3.thermal_violation"], needle)
    gpu.violation_ns[THERMAL] = after_ns  # unchanged since the bad read: judged from there
    again = by_sensor(await adapter.read())["gpu3.thermal_violation"]
    assert (again.quality, again.value) == (Quality.GOOD, after_ns / 1e9)


async def test_throttled_thermal_violation_not_supported_is_logged_once_and_not_asked_again(
    fake: FakeNvml, adapter: NvmlAdapter, caplog: pytest.LogCaptureFixture
) -> None:
    fake.gpus[2].errors["nvmlDeviceGetViolationStatus"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    caplog.set_level("INFO", logger="adapters.sensors.nvml")
    for _ in range(3):
        readings = await adapter.read()
        assert len(readings) == GPUS * PER_GPU - 1
        assert "gpu2.thermal_violation" not in by_sensor(readings)
        assert all(r.usable for r in readings)
    await adapter.connect()  # a reconnect asks again, and says nothing new
    await adapter.read()
    assert fake.calls["nvmlDeviceGetViolationStatus"] == GPUS + 2 * (GPUS - 1) + GPUS
    told = [r.getMessage() for r in caplog.records if "violation counter" in r.getMessage()]
    assert len(told) == 1
    assert "gpu 2" in told[0] and "clock event reasons" in told[0], told


async def test_throttled_thermal_violation_error_is_one_bad_reading_and_asked_again(
    fake: FakeNvml, adapter: NvmlAdapter
) -> None:
    fake.gpus[0].errors["nvmlDeviceGetViolationStatus"] = pynvml.NVML_ERROR_UNKNOWN
    readings = await adapter.read()
    assert_bad(by_sensor(readings)["gpu0.thermal_violation"], "NVML_ERROR_UNKNOWN")
    assert [r.sensor for r in readings if not r.usable] == ["gpu0.thermal_violation"]
    del fake.gpus[0].errors["nvmlDeviceGetViolationStatus"]
    assert by_sensor(await adapter.read())["gpu0.thermal_violation"].usable


def test_fake_violation_status_is_nvml_shaped(fake: FakeNvml) -> None:
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    status = fake.nvmlDeviceGetViolationStatus(handle, pynvml.NVML_PERF_POLICY_BOARD_LIMIT)
    assert isinstance(status, pynvml.c_nvmlViolationTime_t)
    assert status.violationTime == 0
    assert abs(status.referenceTime / 1e6 - time.time()) < 5
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        fake.nvmlDeviceGetViolationStatus(handle, 7)  # 6..9 are not policies
    fake.nvmlShutdown()


async def test_lost_gpu_is_all_bad_and_the_others_report(
    fake: FakeNvml, adapter: NvmlAdapter
) -> None:
    fake.gpus[1].lost = True
    readings = await adapter.read()
    assert len(readings) == GPUS * PER_GPU
    for reading in readings:
        if reading.sensor.startswith("gpu1."):
            assert_bad(reading, "NVML_ERROR_GPU_IS_LOST")
        else:
            assert reading.quality is Quality.GOOD, reading.sensor
    fake.gpus[1].lost = False
    assert all(r.usable for r in await adapter.read())


async def test_gpu_lost_late_in_a_poll_discards_its_earlier_good_readings(
    fake: FakeNvml, adapter: NvmlAdapter
) -> None:
    fake.gpus[0].errors["nvmlDeviceGetPowerUsage"] = pynvml.NVML_ERROR_GPU_IS_LOST
    keyed = by_sensor(await adapter.read())
    for suffix in SENSORS:
        assert_bad(keyed[f"gpu0.{suffix}"], "NVML_ERROR_GPU_IS_LOST")
    assert keyed["gpu1.power"].usable


async def test_gpu_lost_at_connect_is_bad_then_recovers(fake: FakeNvml) -> None:
    fake.gpus[3].lost = True
    nvml = NvmlAdapter("nvml", fake)
    await nvml.connect()  # one lost GPU does not stop the node's other GPUs
    try:
        keyed = by_sensor(await nvml.read())
        for suffix in SENSORS:
            assert_bad(keyed[f"gpu3.{suffix}"], "NVML_ERROR_GPU_IS_LOST")
        assert keyed["gpu3.temperature"].labels["uuid"] == "unknown"
        assert keyed["gpu2.temperature"].usable

        fake.gpus[3].lost = False
        keyed = by_sensor(await nvml.read())  # the handle is fetched again
        assert keyed["gpu3.slowdown_threshold"].value == H100_SXM.slowdown_c
        assert keyed["gpu3.temperature"].labels["uuid"] == fake.gpus[3].uuid
        assert all(r.usable for r in keyed.values())
    finally:
        await nvml.close()


async def test_memory_temperature_field_error_is_checked_per_field(
    fake: FakeNvml, adapter: NvmlAdapter
) -> None:
    fake.gpus[0].errors[MEMORY_TEMP_KEY] = pynvml.NVML_ERROR_NOT_SUPPORTED
    calls = fake.calls["nvmlDeviceGetFieldValues"]
    keyed = by_sensor(await adapter.read())
    assert fake.calls["nvmlDeviceGetFieldValues"] == calls + GPUS  # the call itself succeeded
    assert_bad(keyed["gpu0.memory_temperature"], "NVML_ERROR_NOT_SUPPORTED")
    assert keyed["gpu0.temperature"].usable
    assert keyed["gpu1.memory_temperature"].usable


async def test_memory_temperature_field_gpu_lost_makes_the_gpu_bad(
    fake: FakeNvml, adapter: NvmlAdapter
) -> None:
    fake.gpus[0].errors[MEMORY_TEMP_KEY] = pynvml.NVML_ERROR_GPU_IS_LOST
    keyed = by_sensor(await adapter.read())
    for suffix in SENSORS:
        assert_bad(keyed[f"gpu0.{suffix}"], "NVML_ERROR_GPU_IS_LOST")


@pytest.mark.parametrize(
    ("value_type", "temp", "expected"),
    [
        (pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, 61.6, 62.0),
        (pynvml.NVML_VALUE_TYPE_DOUBLE, 61.5, 61.5),
        (pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG, 48.2, 48.0),
        (pynvml.NVML_VALUE_TYPE_SIGNED_INT, 48.2, 48.0),
    ],
)
async def test_memory_temperature_value_types(
    value_type: int, temp: float, expected: float
) -> None:
    fake = FakeNvml(make_gpus(H100_SXM, 1), memory_temp_value_type=value_type)
    fake.gpus[0].memory_temperature_c = temp
    nvml = NvmlAdapter("nvml", fake)
    await nvml.connect()
    try:
        reading = by_sensor(await nvml.read())["gpu0.memory_temperature"]
    finally:
        await nvml.close()
    assert reading.value == expected
    assert reading.usable


async def test_memory_temperature_unexpected_value_type_is_bad() -> None:
    fake = FakeNvml(make_gpus(H100_SXM, 1), memory_temp_value_type=99)
    nvml = NvmlAdapter("nvml", fake)
    await nvml.connect()
    try:
        reading = by_sensor(await nvml.read())["gpu0.memory_temperature"]
    finally:
        await nvml.close()
    assert_bad(reading, "value type 99")


@pytest.mark.parametrize(
    ("attr", "value", "suffix", "good"),
    [
        ("temperature_c", 150.0, "temperature", True),
        ("temperature_c", 151.0, "temperature", False),
        ("temperature_c", 200.0, "temperature", False),
        ("temperature_c", -5.0, "temperature", False),  # an unsigned NVML value wraps to 4e9
        ("memory_temperature_c", 1000.0, "memory_temperature", False),
        ("power_w", -1.0, "power", False),  # wraps to ~4.29 MW
        ("power_w", 0.0, "power", True),
        ("power_limit_w", 5_000_000.0, "power_limit", False),
    ],
)
async def test_insane_values_are_bad_with_out_of_range(
    fake: FakeNvml, adapter: NvmlAdapter, attr: str, value: float, suffix: str, good: bool
) -> None:
    setattr(fake.gpus[1], attr, value)
    reading = by_sensor(await adapter.read())[f"gpu1.{suffix}"]
    if good:
        assert reading.value == value
        assert reading.usable
    else:
        assert_bad(reading, "out of range")


async def test_negative_signed_temperature_is_out_of_range() -> None:
    fake = FakeNvml(
        make_gpus(H100_SXM, 1), memory_temp_value_type=pynvml.NVML_VALUE_TYPE_SIGNED_INT
    )
    fake.gpus[0].memory_temperature_c = -41.0
    nvml = NvmlAdapter("nvml", fake)
    await nvml.connect()
    try:
        reading = by_sensor(await nvml.read())["gpu0.memory_temperature"]
    finally:
        await nvml.close()
    assert_bad(reading, "out of range", "-41")


async def test_insane_threshold_is_bad() -> None:
    model = GpuModel("broken", 200, 92, 87, 95, 700.0, 70.0)
    nvml = NvmlAdapter("nvml", fake_node(model, count=1))
    await nvml.connect()
    try:
        keyed = by_sensor(await nvml.read())
    finally:
        await nvml.close()
    assert_bad(keyed["gpu0.slowdown_threshold"], "out of range")
    assert keyed["gpu0.shutdown_threshold"].value == 92.0


@pytest.mark.parametrize(
    "code", [pynvml.NVML_ERROR_UNINITIALIZED, pynvml.NVML_ERROR_DRIVER_NOT_LOADED]
)
async def test_nvml_gone_during_a_read_raises_unavailable(
    fake: FakeNvml, adapter: NvmlAdapter, code: int
) -> None:
    fake.gpus[2].errors["nvmlDeviceGetTemperature"] = code
    with pytest.raises(SourceUnavailable, match="NVML stopped answering") as info:
        await adapter.read()
    assert isinstance(info.value.__cause__, pynvml.NVMLError)
    del fake.gpus[2].errors["nvmlDeviceGetTemperature"]
    await adapter.connect()  # what the runner does next
    assert all(r.usable for r in await adapter.read())


async def test_nvml_shut_down_behind_our_back_raises_unavailable(
    fake: FakeNvml, adapter: NvmlAdapter
) -> None:
    fake.nvmlShutdown()
    with pytest.raises(SourceUnavailable, match="NVML_ERROR_UNINITIALIZED"):
        await adapter.read()


# --- clock-event reasons: new API and fallback ------------------------------------------


async def test_throttle_reasons_fallback_when_the_new_api_is_missing() -> None:
    fake = FakeNvml(make_gpus(H100_SXM, 2), has_clock_events_api=False)
    assert not hasattr(fake, "nvmlDeviceGetCurrentClocksEventReasons")
    fake.gpus[1].clock_event_reasons = 0x8
    nvml = NvmlAdapter("nvml", fake)
    await nvml.connect()
    try:
        keyed = by_sensor(await nvml.read())
        await nvml.read()
    finally:
        await nvml.close()
    assert keyed["gpu1.clock_event_reasons"].value == 8.0
    assert keyed["gpu1.clock_event_reasons"].labels["active"] == "hw_slowdown"
    assert fake.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 4


@pytest.mark.parametrize(
    "code", [pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, pynvml.NVML_ERROR_NOT_SUPPORTED]
)
async def test_fallback_on_error_is_remembered(
    fake: FakeNvml, adapter: NvmlAdapter, code: int
) -> None:
    for gpu in fake.gpus:
        gpu.errors["nvmlDeviceGetCurrentClocksEventReasons"] = code
        gpu.clock_event_reasons = 0x20
    for _ in range(3):
        keyed = by_sensor(await adapter.read())
        assert keyed["gpu3.clock_event_reasons"].value == 32.0
    assert fake.calls["nvmlDeviceGetCurrentClocksEventReasons"] == 1  # tried once only
    assert fake.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 3 * GPUS


async def test_new_api_is_used_once_it_works(fake: FakeNvml, adapter: NvmlAdapter) -> None:
    await adapter.read()
    await adapter.read()
    assert fake.calls["nvmlDeviceGetCurrentClocksEventReasons"] == 2 * GPUS
    assert fake.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 0


async def test_other_error_on_the_new_api_does_not_fall_back(
    fake: FakeNvml, adapter: NvmlAdapter
) -> None:
    fake.gpus[0].errors["nvmlDeviceGetCurrentClocksEventReasons"] = pynvml.NVML_ERROR_UNKNOWN
    keyed = by_sensor(await adapter.read())
    assert_bad(keyed["gpu0.clock_event_reasons"], "NVML_ERROR_UNKNOWN")
    assert keyed["gpu1.clock_event_reasons"].usable
    assert fake.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 0


async def test_both_clock_apis_unsupported_is_bad(fake: FakeNvml, adapter: NvmlAdapter) -> None:
    for fn in (
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
    ):
        fake.gpus[1].errors[fn] = pynvml.NVML_ERROR_NOT_SUPPORTED
    keyed = by_sensor(await adapter.read())
    assert_bad(keyed["gpu1.clock_event_reasons"], "NVML_ERROR_NOT_SUPPORTED")
    assert keyed["gpu0.clock_event_reasons"].usable


# --- connect, GPU selection, close ------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "needles"),
    [
        (
            pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
            ("libnvidia-ml.so.1 not found", "is the NVIDIA driver installed?"),
        ),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, ("NVIDIA kernel driver not loaded", "modprobe")),
        (pynvml.NVML_ERROR_NO_PERMISSION, ("no permission to /dev/nvidia*",)),
        (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, ("versions differ", "reboot")),
    ],
)
async def test_init_failures_are_setup_errors_that_say_what_to_do(
    code: int, needles: tuple[str, ...]
) -> None:
    fake = fake_node(count=1)
    fake.init_error = code
    nvml = NvmlAdapter("gpus", fake)
    with pytest.raises(SourceSetupError) as info:
        await nvml.connect()
    message = str(info.value)
    assert message.startswith("gpus: ")
    for needle in needles:
        assert needle in message
    assert fake.calls["nvmlDeviceGetCount"] == 0
    assert isinstance(info.value.__cause__, pynvml.NVMLError)
    with pytest.raises(SourceUnavailable, match="not connected"):
        await nvml.read()
    await nvml.close()


async def test_other_init_failure_is_unavailable_then_reconnect_works() -> None:
    fake = fake_node(count=2)
    fake.init_error = pynvml.NVML_ERROR_UNKNOWN
    nvml = NvmlAdapter("nvml", fake)
    with pytest.raises(SourceUnavailable, match="NVML_ERROR_UNKNOWN") as info:
        await nvml.connect()
    assert not isinstance(info.value, SourceSetupError)
    fake.init_error = None
    await nvml.connect()
    try:
        assert len(await nvml.read()) == 2 * PER_GPU
    finally:
        await nvml.close()


async def test_gpu_indices_restrict_polling(fake: FakeNvml) -> None:
    fake.gpus[0].lost = True  # never touched
    nvml = NvmlAdapter("nvml", fake, gpu_indices=[3, 1, 3])
    await nvml.connect()
    try:
        readings = await nvml.read()
    finally:
        await nvml.close()
    assert {r.sensor.split(".")[0] for r in readings} == {"gpu1", "gpu3"}
    assert [r.labels["gpu"] for r in readings[::PER_GPU]] == ["3", "1"]
    assert all(r.usable for r in readings)
    assert fake.calls["nvmlDeviceGetHandleByIndex"] == 2


@pytest.mark.parametrize("indices", [[0, 4], [-1], [7]])
async def test_gpu_index_that_does_not_exist_is_a_setup_error(
    fake: FakeNvml, indices: list[int]
) -> None:
    nvml = NvmlAdapter("nvml", fake, gpu_indices=indices)
    with pytest.raises(SourceSetupError, match=r"do not exist: this node has 4 GPUs \(0\.\.3\)"):
        await nvml.connect()
    assert not fake.initialized  # the failed connect shut NVML down again
    await nvml.close()


async def test_node_without_gpus_is_a_setup_error() -> None:
    fake = FakeNvml([])
    with pytest.raises(SourceSetupError, match="no GPUs"):
        await NvmlAdapter("nvml", fake).connect()
    assert not fake.initialized


async def test_read_before_connect_and_after_close_is_unavailable(fake: FakeNvml) -> None:
    nvml = NvmlAdapter("nvml", fake)
    with pytest.raises(SourceUnavailable, match="not connected"):
        await nvml.read()
    assert sum(fake.calls.values()) == 0
    await nvml.connect()
    await nvml.close()
    with pytest.raises(SourceUnavailable, match="not connected"):
        await nvml.read()


async def test_close_shuts_nvml_down_is_idempotent_and_allows_reconnect(fake: FakeNvml) -> None:
    nvml = NvmlAdapter("nvml", fake)
    await nvml.close()  # before connect: nothing to do
    assert fake.calls["nvmlShutdown"] == 0
    await nvml.connect()
    assert fake.initialized
    await nvml.close()
    await nvml.close()
    assert not fake.initialized
    assert fake.calls["nvmlShutdown"] == 1
    await nvml.connect()
    try:
        assert len(await nvml.read()) == GPUS * PER_GPU
    finally:
        await nvml.close()
    assert not fake.initialized


async def test_close_ignores_shutdown_errors(fake: FakeNvml, adapter: NvmlAdapter) -> None:
    fake.nvmlShutdown()  # the adapter's own shutdown now fails with UNINITIALIZED
    await adapter.close()
    assert fake.calls["nvmlShutdown"] == 2


def test_load_binding() -> None:
    assert load_binding("pynvml") is pynvml
    with pytest.raises(SourceSetupError, match="nvidia-ml-py package is missing"):
        load_binding("pynvml_that_does_not_exist")


# --- the thread rule --------------------------------------------------------------------


async def test_all_nvml_calls_run_on_one_thread_that_is_not_the_loop(fake: FakeNvml) -> None:
    nvml = NvmlAdapter("nvml", fake)
    await nvml.connect()
    for _ in range(3):
        await nvml.read()
    await nvml.close()
    assert sum(fake.calls.values()) > 3 * GPUS * 5
    assert len(fake.thread_ids) == 1
    assert threading.get_ident() not in fake.thread_ids


async def test_hung_gpu_times_out_and_the_next_read_is_refused_at_once(
    fake: FakeNvml, adapter: NvmlAdapter
) -> None:
    fake.gpus[1].delay_s = 0.3
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.1):
            await adapter.read()
    assert adapter.busy
    temps = fake.calls["nvmlDeviceGetTemperature"]

    t0 = time.monotonic()
    with pytest.raises(SourceUnavailable, match="previous call still running"):
        await adapter.read()
    assert time.monotonic() - t0 < 0.05  # refused, not queued behind the hung call
    fake.gpus[1].delay_s = 0.0
    await wait_idle(adapter)
    assert fake.calls["nvmlDeviceGetTemperature"] == temps + GPUS - 2  # only the abandoned poll
    assert all(r.usable for r in await adapter.read())


async def test_concurrent_reads_do_not_queue(fake: FakeNvml, adapter: NvmlAdapter) -> None:
    fake.gpus[0].delay_s = 0.02
    results = await asyncio.gather(adapter.read(), adapter.read(), return_exceptions=True)
    assert sum(isinstance(r, SourceUnavailable) for r in results) == 1
    assert sum(isinstance(r, list) and len(r) == GPUS * PER_GPU for r in results) == 1


async def test_event_loop_keeps_ticking_during_a_slow_read(
    fake: FakeNvml, adapter: NvmlAdapter
) -> None:
    fake.gpus[0].delay_s = 0.05  # five calls per poll: about 0.25 s
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    task = asyncio.create_task(ticker())
    try:
        t0 = time.monotonic()
        readings = await adapter.read()
        elapsed = time.monotonic() - t0
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert elapsed >= 0.25
    assert all(r.usable for r in readings)
    assert ticks >= 10  # a blocked loop would tick at most once


async def test_close_during_a_hung_call_returns_at_once(fake: FakeNvml) -> None:
    nvml = NvmlAdapter("nvml", fake)
    await nvml.connect()
    fake.gpus[0].delay_s = 0.2
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await nvml.read()
    t0 = time.monotonic()
    await nvml.close()
    assert time.monotonic() - t0 < 0.05
    with pytest.raises(SourceUnavailable, match="previous call still running"):
        await nvml.connect()  # no second thread piles onto a hung driver
    fake.gpus[0].delay_s = 0.0
    await wait_idle(nvml)
    await nvml.connect()
    try:
        assert len(await nvml.read()) == GPUS * PER_GPU
    finally:
        await nvml.close()


# --- the fake mirrors pynvml -------------------------------------------------------------


@pytest.mark.parametrize("fn", FUNCTIONS)
def test_fake_functions_have_pynvml_signatures(fake: FakeNvml, fn: str) -> None:
    real = inspect.signature(getattr(pynvml, fn))
    mine = inspect.signature(getattr(fake, fn))
    assert list(mine.parameters) == list(real.parameters)


def test_fake_raises_pynvml_error_classes_and_returns_real_structures(fake: FakeNvml) -> None:
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    values = fake.nvmlDeviceGetFieldValues(handle, [pynvml.NVML_FI_DEV_MEMORY_TEMP])
    assert isinstance(values[0], pynvml.c_nvmlFieldValue_t)
    assert values[0].nvmlReturn == pynvml.NVML_SUCCESS
    assert isinstance(fake.nvmlDeviceGetPciInfo(handle), pynvml.nvmlPciInfo_t)
    assert fake.nvmlDeviceGetPciInfo(handle).busId == fake.gpus[0].pci_bus_id
    assert fake.nvmlDeviceGetPowerUsage(handle) == 70_000  # milliwatts
    fake.gpus[0].lost = True
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        fake.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        fake.nvmlDeviceGetHandleByIndex(GPUS)
    assert fake.NVML_ERROR_GPU_IS_LOST == pynvml.NVML_ERROR_GPU_IS_LOST  # type: ignore[attr-defined]
    fake.nvmlShutdown()
    assert not fake.initialized
