"""NvmlAdapter with the real pynvml module: a setup error without a driver, readings with one."""

from __future__ import annotations

import ctypes

import pynvml
import pytest

from adapters.errors import SourceSetupError, SourceUnavailable
from adapters.sensors.nvml import NvmlAdapter, load_binding
from fakes.nvml import FUNCTIONS, fake_node
from policies.model import Quality, SensorKind


def _library_loads() -> bool:
    """True when libnvidia-ml.so.1 can be loaded on this machine."""
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


async def test_real_binding_connects_or_says_what_is_missing() -> None:
    nvml = NvmlAdapter("nvml", load_binding("pynvml"))
    try:
        if not _library_loads():
            with pytest.raises(SourceSetupError) as info:
                await nvml.connect()
            message = str(info.value)
            assert "libnvidia-ml.so.1 not found" in message
            assert "NVIDIA driver" in message
            assert "NVML_ERROR_LIBRARY_NOT_FOUND" in message
            assert isinstance(info.value.__cause__, pynvml.NVMLError_LibraryNotFound)
            with pytest.raises(SourceUnavailable, match="not connected"):
                await nvml.read()
            return
        await nvml.connect()  # a GPU node: real readings
        readings = await nvml.read()
        temps = [r for r in readings if r.kind is SensorKind.GPU_TEMPERATURE]
        assert temps
        assert all(r.quality is Quality.GOOD for r in temps)
        assert all(r.labels["uuid"].startswith(("GPU-", "MIG-")) for r in temps)
        assert 8 * len(temps) <= len(readings) <= 9 * len(temps)  # 9: a violation counter
        assert not any(r.value is not None and r.value != r.value for r in readings)  # no NaN
    finally:
        await nvml.close()


async def test_real_binding_close_without_connect_never_raises() -> None:
    nvml = NvmlAdapter("nvml", load_binding("pynvml"))
    await nvml.close()
    await nvml.close()


@pytest.mark.parametrize("fn", [f for f in FUNCTIONS if f != "nvmlInit"])
def test_fake_raises_what_real_pynvml_raises_before_init(fn: str) -> None:
    """Before nvmlInit both refuse every call with NVMLError_Uninitialized."""
    fake = fake_node(count=1)
    args: tuple[object, ...] = {
        "nvmlShutdown": (),
        "nvmlDeviceGetCount": (),
        "nvmlDeviceGetHandleByIndex": (0,),
        "nvmlDeviceGetTemperature": (None, pynvml.NVML_TEMPERATURE_GPU),
        "nvmlDeviceGetTemperatureThreshold": (None, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
        "nvmlDeviceGetFieldValues": (None, [pynvml.NVML_FI_DEV_MEMORY_TEMP]),
        "nvmlDeviceSetPowerManagementLimit": (None, 300_000),
        "nvmlDeviceGetViolationStatus": (None, pynvml.NVML_PERF_POLICY_THERMAL),
    }.get(fn, (None,))
    if _library_loads() and fn != "nvmlDeviceGetCount":
        pytest.skip("with a driver present, real calls on a None handle are not comparable")
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        getattr(pynvml, fn)(*args)
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        getattr(fake, fn)(*args)
