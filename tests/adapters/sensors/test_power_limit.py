"""The power limiters against the fake NVML: NVML's semantics, errors mapped, dry run inert."""

from __future__ import annotations

import math

import pynvml
import pytest

from adapters.sensors.power_limit import (
    DirectNvmlLimiter,
    DryRunLimiter,
    GpuLimit,
    PowerLimitError,
    check_request,
)
from fakes.gpus import A100_SXM4, H100_SXM
from fakes.nvml import FakeNvml, fake_node


def _fake(*, privileged: bool = True, count: int = 2) -> FakeNvml:
    fake = fake_node(H100_SXM, count=count)
    fake.privileged = privileged
    return fake


# --- the fake's NVML calls ----------------------------------------------------------------


def test_power_cap_fake_reports_constraints_default_and_enforced_in_milliwatts() -> None:
    fake = fake_node(A100_SXM4, count=1)
    fake.nvmlInit()
    h = fake.nvmlDeviceGetHandleByIndex(0)
    assert fake.nvmlDeviceGetPowerManagementLimitConstraints(h) == [100_000, 500_000]
    assert fake.nvmlDeviceGetPowerManagementDefaultLimit(h) == 500_000
    assert fake.nvmlDeviceGetPowerManagementLimit(h) == 500_000
    assert fake.nvmlDeviceGetEnforcedPowerLimit(h) == 500_000


def test_power_cap_fake_refuses_unprivileged_and_out_of_range_like_nvml() -> None:
    fake = fake_node(H100_SXM, count=1)
    fake.nvmlInit()
    h = fake.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NoPermission):
        fake.nvmlDeviceSetPowerManagementLimit(h, 300_000)
    fake.privileged = True
    for bad in (199_999, 700_001):
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            fake.nvmlDeviceSetPowerManagementLimit(h, bad)
    assert fake.gpus[0].requested_limit_w == 700.0
    fake.nvmlDeviceSetPowerManagementLimit(h, 300_000)
    assert fake.nvmlDeviceGetEnforcedPowerLimit(h) == 300_000


def test_power_cap_fake_enforces_the_lowest_actor_and_draws_under_it() -> None:
    fake = _fake(count=1)
    fake.nvmlInit()
    h = fake.nvmlDeviceGetHandleByIndex(0)
    gpu = fake.gpus[0]
    gpu.power_w = 650.0  # the demand
    gpu.external_limit_w = 500.0  # e.g. the BMC
    fake.nvmlDeviceSetPowerManagementLimit(h, 600_000)
    assert fake.nvmlDeviceGetPowerManagementLimit(h) == 600_000
    assert fake.nvmlDeviceGetEnforcedPowerLimit(h) == 500_000
    assert fake.nvmlDeviceGetPowerUsage(h) == 500_000
    fake.nvmlDeviceSetPowerManagementLimit(h, 250_000)
    assert fake.nvmlDeviceGetEnforcedPowerLimit(h) == 250_000
    assert fake.nvmlDeviceGetPowerUsage(h) == 250_000


# --- DirectNvmlLimiter ----------------------------------------------------------------------


async def test_power_cap_direct_sets_and_reads_back() -> None:
    fake = _fake()
    limiter = DirectNvmlLimiter(fake)
    try:
        before = await limiter.limits()
        assert [g.index for g in before] == [0, 1]
        assert before[1] == GpuLimit(fake.gpus[1].uuid, 1, 700.0, 700.0, 700.0, 200.0, 700.0)
        after = await limiter.set_limit(fake.gpus[1].uuid, 350.0)
        assert (after.requested_w, after.enforced_w) == (350.0, 350.0)
        assert fake.gpus[1].power_limit_w == 350.0
        assert fake.gpus[0].power_limit_w == 700.0
        assert fake.calls["nvmlInit"] == 1  # initialised once, kept
    finally:
        await limiter.close()
    assert not fake.initialized


async def test_power_cap_direct_maps_no_permission_to_permanent() -> None:
    fake = _fake(privileged=False)
    limiter = DirectNvmlLimiter(fake)
    try:
        with pytest.raises(PowerLimitError, match="NO_PERMISSION") as info:
            await limiter.set_limit(fake.gpus[0].uuid, 400.0)
        assert info.value.permanent
        assert fake.gpus[0].requested_limit_w == 700.0
    finally:
        await limiter.close()


async def test_power_cap_direct_maps_invalid_argument_to_permanent() -> None:
    fake = _fake()
    # NVML's constraints narrower than what its default says: NVML itself refuses.
    fake.gpus[0].errors["nvmlDeviceSetPowerManagementLimit"] = pynvml.NVML_ERROR_INVALID_ARGUMENT
    limiter = DirectNvmlLimiter(fake)
    try:
        with pytest.raises(PowerLimitError, match="INVALID_ARGUMENT") as info:
            await limiter.set_limit(fake.gpus[0].uuid, 400.0)
        assert info.value.permanent
    finally:
        await limiter.close()


async def test_power_cap_direct_transient_nvml_error_is_not_permanent() -> None:
    fake = _fake()
    fake.gpus[0].errors["nvmlDeviceSetPowerManagementLimit"] = pynvml.NVML_ERROR_TIMEOUT
    limiter = DirectNvmlLimiter(fake)
    try:
        with pytest.raises(PowerLimitError) as info:
            await limiter.set_limit(fake.gpus[0].uuid, 400.0)
        assert not info.value.permanent
    finally:
        await limiter.close()


@pytest.mark.parametrize("watts", [math.nan, math.inf, -1.0, 0.0, 199.0, 700.5, 10_000.0])
async def test_power_cap_direct_refuses_watts_outside_min_and_default(watts: float) -> None:
    fake = _fake()
    limiter = DirectNvmlLimiter(fake)
    try:
        with pytest.raises(PowerLimitError) as info:
            await limiter.set_limit(fake.gpus[0].uuid, watts)
        assert info.value.permanent
        assert fake.calls["nvmlDeviceSetPowerManagementLimit"] == 0
    finally:
        await limiter.close()


async def test_power_cap_direct_unknown_uuid_is_permanent() -> None:
    fake = _fake()
    limiter = DirectNvmlLimiter(fake)
    try:
        with pytest.raises(PowerLimitError, match="no GPU") as info:
            await limiter.set_limit("GPU-not-here", 400.0)
        assert info.value.permanent
    finally:
        await limiter.close()


async def test_power_cap_direct_sees_another_actors_change() -> None:
    fake = _fake()
    limiter = DirectNvmlLimiter(fake)
    try:
        await limiter.set_limit(fake.gpus[0].uuid, 400.0)
        fake.admin_set_limit(0, 550.0)  # an admin's nvidia-smi -pl 550
        fake.gpus[1].external_limit_w = 450.0  # an out-of-band cap
        fake.admin_set_limit(1, 700.0)
        gpu0, gpu1 = await limiter.limits()
        assert (gpu0.requested_w, gpu0.enforced_w) == (550.0, 550.0)
        assert (gpu1.requested_w, gpu1.enforced_w) == (700.0, 450.0)
    finally:
        await limiter.close()


async def test_power_cap_direct_without_nvml_is_permanent() -> None:
    fake = FakeNvml([], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    limiter = DirectNvmlLimiter(fake)
    try:
        with pytest.raises(PowerLimitError, match="DRIVER_NOT_LOADED") as info:
            await limiter.limits()
        assert info.value.permanent
    finally:
        await limiter.close()


async def test_power_cap_direct_finds_gpus_again_after_gpu_lost() -> None:
    fake = _fake()
    limiter = DirectNvmlLimiter(fake)
    try:
        await limiter.limits()
        fake.gpus[0].lost = True
        with pytest.raises(PowerLimitError, match="GPU_IS_LOST") as info:
            await limiter.limits()
        assert not info.value.permanent
        fake.gpus[0].lost = False
        assert len(await limiter.limits()) == 2
        assert fake.calls["nvmlDeviceGetCount"] == 2
    finally:
        await limiter.close()


# --- DryRunLimiter --------------------------------------------------------------------------


async def test_power_cap_dry_run_changes_nothing_and_records() -> None:
    fake = _fake()
    dry = DryRunLimiter(DirectNvmlLimiter(fake))
    try:
        state = await dry.set_limit(fake.gpus[0].uuid, 300.0)
        assert (state.requested_w, state.enforced_w) == (700.0, 700.0)
        assert dry.requests == [(fake.gpus[0].uuid, 300.0)]
        assert fake.calls["nvmlDeviceSetPowerManagementLimit"] == 0
        assert fake.gpus[0].power_limit_w == 700.0
        with pytest.raises(PowerLimitError):
            await dry.set_limit(fake.gpus[0].uuid, 100.0)  # refused as a real one would be
        assert len(dry.requests) == 1
    finally:
        await dry.close()
    assert not fake.initialized


def test_power_cap_check_request_never_above_default() -> None:
    limit = GpuLimit("GPU-x", 0, 400.0, 400.0, 600.0, 200.0, 700.0)
    assert check_request(limit, 600) == 600.0
    with pytest.raises(PowerLimitError, match="default"):
        check_request(limit, 650.0)
    with pytest.raises(PowerLimitError, match="number"):
        check_request(limit, True)
    with pytest.raises(PowerLimitError, match="number"):
        check_request(limit, "300")
