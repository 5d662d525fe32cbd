"""A fake NVML at the binding layer: pynvml's names, signatures, return shapes and errors.

Backed by FakeGpu state (fakes/gpus.py), so the simulator can drive it. Errors are
pynvml's real classes (``pynvml.NVMLError(code)`` yields the subclass) and field
values are real ``c_nvmlFieldValue_t`` arrays, so the adapter runs unchanged against
this or the real module.
"""

from __future__ import annotations

import collections
import threading
import time
import types
from typing import Any

import pynvml

from fakes.gpus import H100_SXM, FakeGpu, GpuModel, make_gpus

_UINT_MASK = 0xFFFFFFFF  # NVML returns unsigned ints: a negative value wraps like in C
_ULL_MASK = 0xFFFFFFFFFFFFFFFF
# The nvmlPerfPolicyType_t values NVML defines (6..9 are unused).
_PERF_POLICIES = frozenset(
    {
        pynvml.NVML_PERF_POLICY_POWER,
        pynvml.NVML_PERF_POLICY_THERMAL,
        pynvml.NVML_PERF_POLICY_SYNC_BOOST,
        pynvml.NVML_PERF_POLICY_BOARD_LIMIT,
        pynvml.NVML_PERF_POLICY_LOW_UTILIZATION,
        pynvml.NVML_PERF_POLICY_RELIABILITY,
        pynvml.NVML_PERF_POLICY_TOTAL_APP_CLOCKS,
        pynvml.NVML_PERF_POLICY_TOTAL_BASE_CLOCKS,
    }
)


def field_error_key(field_id: int) -> str:
    """The FakeGpu.errors key that makes one field of nvmlDeviceGetFieldValues fail."""
    return f"nvmlDeviceGetFieldValues[{field_id}]"


class FakeHandle:
    """Stands in for pynvml's c_nvmlDevice_t; valid only with the FakeNvml that made it."""

    __slots__ = ("gpu", "owner")

    def __init__(self, gpu: FakeGpu, owner: FakeNvml) -> None:
        self.gpu = gpu
        self.owner = owner


def _set_requested(gpu: FakeGpu, watts: float) -> None:
    gpu.requested_limit_w = watts
    gpu.power_limit_w = gpu.enforced_limit_w()


def _uint(value: float) -> int:
    """A reading as NVML's C API returns it: rounded, unsigned 32-bit."""
    return round(value) & _UINT_MASK


class FakeNvml:
    """The pynvml functions rackguard uses, over a list of FakeGpu.

    Faults per GPU: ``errors[fn_name] = code`` raises on that function,
    ``errors[field_error_key(id)] = code`` fails one field (``errors[
    "nvmlDeviceGetViolationStatus"] = NVML_ERROR_NOT_SUPPORTED`` is a GPU without
    violation counters, like many non-datacenter boards), ``lost`` raises GPU_IS_LOST
    on every per-device call, ``delay_s`` sleeps (blocking) in each such call.
    ``calls`` counts calls per function and ``thread_ids`` records the calling threads.

    Power limits follow NVML: ``nvmlDeviceSetPowerManagementLimit`` needs
    ``privileged`` (root; NO_PERMISSION otherwise) and a value within the GPU's
    constraints (INVALID_ARGUMENT otherwise); the enforced limit is the lowest of the
    power-management limit and other actors' (``FakeGpu.external_limit_w``);
    ``admin_set_limit`` is an administrator's ``nvidia-smi -pl``. The draw reported is
    ``min(power_w, enforced limit)``: ``power_w`` is the GPU's demand.
    """

    NVMLError = pynvml.NVMLError

    def __init__(
        self,
        gpus: list[FakeGpu],
        *,
        init_error: int | None = None,
        has_clock_events_api: bool = True,
        strings_as_bytes: bool = False,
        memory_temp_value_type: int = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT,
        driver_version: str = "550.54.15",
        privileged: bool = False,
    ) -> None:
        self.gpus = gpus
        self.privileged = privileged
        self.driver_version = driver_version
        self.init_error = init_error
        self.strings_as_bytes = strings_as_bytes  # like pynvml before 11.5
        self.memory_temp_value_type = memory_temp_value_type
        self.calls: collections.Counter[str] = collections.Counter()
        self.thread_ids: set[int] = set()
        self._refcount = 0
        if has_clock_events_api:
            # Set per instance so that hasattr() is False without the newer API.
            self.nvmlDeviceGetCurrentClocksEventReasons = self._current_clocks_event_reasons

    @property
    def initialized(self) -> bool:
        """True between nvmlInit and the matching nvmlShutdown."""
        return self._refcount > 0

    # --- library ----------------------------------------------------------------------

    def nvmlInit(self) -> None:
        """Raises init_error when set; otherwise counts one more init, like NVML."""
        self._enter("nvmlInit", need_init=False)
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)
        self._refcount += 1

    def nvmlSystemGetDriverVersion(self) -> Any:
        """The driver's version string (bytes like pynvml before 11.5 when asked)."""
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver_version.encode() if self.strings_as_bytes else self.driver_version

    def nvmlShutdown(self) -> None:
        """Undo one nvmlInit; UNINITIALIZED when there is none."""
        self._enter("nvmlShutdown")
        self._refcount -= 1

    def nvmlDeviceGetCount(self) -> int:
        """Number of GPUs."""
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        """A handle; INVALID_ARGUMENT for an index that does not exist."""
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpus[index]
        self._fault("nvmlDeviceGetHandleByIndex", gpu)
        return FakeHandle(gpu, self)

    # --- identity ---------------------------------------------------------------------

    def nvmlDeviceGetUUID(self, handle: Any) -> Any:
        """The GPU's UUID (str, or bytes when strings_as_bytes)."""
        gpu = self._device("nvmlDeviceGetUUID", handle)
        return gpu.uuid.encode() if self.strings_as_bytes else gpu.uuid

    def nvmlDeviceGetName(self, handle: Any) -> Any:
        """The model name (str, or bytes when strings_as_bytes)."""
        gpu = self._device("nvmlDeviceGetName", handle)
        return gpu.model.name.encode() if self.strings_as_bytes else gpu.model.name

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        """A real nvmlPciInfo_t (whose busId reads as str), or an old-style bytes busId."""
        gpu = self._device("nvmlDeviceGetPciInfo", handle)
        bus_id = gpu.pci_bus_id.encode()
        if self.strings_as_bytes:
            return types.SimpleNamespace(busId=bus_id, busIdLegacy=bus_id)
        domain, bus, rest = gpu.pci_bus_id.split(":")
        info = pynvml.nvmlPciInfo_t()
        info.busId = bus_id
        info.busIdLegacy = bus_id
        info.domain = int(domain, 16)
        info.bus = int(bus, 16)
        info.device = int(rest.split(".")[0], 16)
        return info

    # --- thermal ----------------------------------------------------------------------

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        """Core temperature in whole degrees C."""
        gpu = self._device("nvmlDeviceGetTemperature", handle)
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return _uint(gpu.temperature_c)

    def nvmlDeviceGetTemperatureThreshold(self, handle: Any, threshold: int) -> int:
        """The model's thresholds in degrees C; NOT_SUPPORTED for the others."""
        gpu = self._device("nvmlDeviceGetTemperatureThreshold", handle)
        model = gpu.model
        values = {
            pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: model.shutdown_c,
            pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: model.slowdown_c,
            pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX: model.max_operating_c,
            pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX: model.memory_max_c,
        }
        if threshold not in values:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return _uint(values[threshold])

    def nvmlDeviceGetFieldValues(self, handle: Any, fieldIds: list[Any]) -> Any:
        """A ctypes array of c_nvmlFieldValue_t; each field carries its own nvmlReturn."""
        gpu = self._device("nvmlDeviceGetFieldValues", handle)
        values = (pynvml.c_nvmlFieldValue_t * len(fieldIds))()
        now_us = int(time.time() * 1e6)
        for fv, field_id in zip(values, fieldIds, strict=True):
            if isinstance(field_id, tuple):
                fv.fieldId, fv.scopeId = field_id
            else:
                fv.fieldId = field_id
            fv.timestamp = now_us
            code = gpu.errors.get(field_error_key(fv.fieldId))
            if code is not None:
                fv.nvmlReturn = code
            elif fv.fieldId == pynvml.NVML_FI_DEV_MEMORY_TEMP:
                fv.nvmlReturn = pynvml.NVML_SUCCESS
                self._set_value(fv, gpu.memory_temperature_c)
            else:
                fv.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return values

    def _set_value(self, fv: Any, value: float) -> None:
        """Store value in the union member that memory_temp_value_type names."""
        kind = self.memory_temp_value_type
        fv.valueType = kind
        if kind == pynvml.NVML_VALUE_TYPE_DOUBLE:
            fv.value.dVal = value
        elif kind == pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG:
            fv.value.sllVal = round(value)
        elif kind == pynvml.NVML_VALUE_TYPE_SIGNED_INT:
            fv.value.siVal = round(value)
        else:  # unsigned int, and whatever odd type a test asks for
            fv.value.uiVal = _uint(value)

    # --- power and clocks -------------------------------------------------------------

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        """Board power draw in milliwatts: the demand, held at the enforced limit."""
        gpu = self._device("nvmlDeviceGetPowerUsage", handle)
        return _uint(min(gpu.power_w, gpu.power_limit_w) * 1000)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        """Enforced power limit in milliwatts."""
        gpu = self._device("nvmlDeviceGetEnforcedPowerLimit", handle)
        return _uint(gpu.power_limit_w * 1000)

    def nvmlDeviceGetPowerManagementLimit(self, handle: Any) -> int:
        """The power-management limit last set (or the default), in milliwatts."""
        gpu = self._device("nvmlDeviceGetPowerManagementLimit", handle)
        return _uint(gpu.requested_limit_w * 1000)

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: Any) -> int:
        """The default power-management limit in milliwatts."""
        gpu = self._device("nvmlDeviceGetPowerManagementDefaultLimit", handle)
        return _uint(gpu.model.power_limit_w * 1000)

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: Any) -> list[int]:
        """[min, max] settable limit in milliwatts (pynvml returns a two-item list)."""
        gpu = self._device("nvmlDeviceGetPowerManagementLimitConstraints", handle)
        return [_uint(gpu.model.min_power_limit_w * 1000), _uint(gpu.model.power_limit_w * 1000)]

    def nvmlDeviceSetPowerManagementLimit(self, handle: Any, limit: int) -> None:
        """Set the power-management limit (mW): NO_PERMISSION unless privileged,
        INVALID_ARGUMENT outside the constraints."""
        gpu = self._device("nvmlDeviceSetPowerManagementLimit", handle)
        if not self.privileged:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)
        low, high = gpu.model.min_power_limit_w * 1000, gpu.model.power_limit_w * 1000
        if not isinstance(limit, int) or not low <= limit <= high:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        _set_requested(gpu, limit / 1000)

    def admin_set_limit(self, index: int, watts: float) -> None:
        """Another actor (an admin's ``nvidia-smi -pl``) replaces a GPU's limit."""
        _set_requested(self.gpus[index], watts)

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        """The deprecated name of the clock-event reasons bitmask."""
        gpu = self._device("nvmlDeviceGetCurrentClocksThrottleReasons", handle)
        return gpu.clock_event_reasons

    def _current_clocks_event_reasons(self, handle: Any) -> int:
        """nvmlDeviceGetCurrentClocksEventReasons: the clock-event reasons bitmask."""
        gpu = self._device("nvmlDeviceGetCurrentClocksEventReasons", handle)
        return gpu.clock_event_reasons

    def nvmlDeviceGetViolationStatus(self, device: Any, perfPolicyType: int) -> Any:
        """A c_nvmlViolationTime_t: violationTime in ns since the driver loaded,
        referenceTime the CPU time in microseconds; INVALID_ARGUMENT for an unknown policy.
        """
        gpu = self._device("nvmlDeviceGetViolationStatus", device)
        if perfPolicyType not in _PERF_POLICIES:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        status = pynvml.c_nvmlViolationTime_t()
        status.referenceTime = int(time.time() * 1e6)
        status.violationTime = gpu.violation_ns.get(perfPolicyType, 0) & _ULL_MASK
        return status

    # --- plumbing ---------------------------------------------------------------------

    def _enter(self, name: str, *, need_init: bool = True) -> None:
        """Count the call and its thread; UNINITIALIZED before nvmlInit like NVML."""
        self.calls[name] += 1
        self.thread_ids.add(threading.get_ident())
        if need_init and self._refcount <= 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)

    def _device(self, name: str, handle: Any) -> FakeGpu:
        """The GPU behind a handle, after applying its fault controls."""
        self._enter(name)
        if not isinstance(handle, FakeHandle) or handle.owner is not self:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = handle.gpu
        gpu.advance_violations(time.monotonic())
        self._fault(name, gpu)
        return gpu

    @staticmethod
    def _fault(name: str, gpu: FakeGpu) -> None:
        """Apply delay_s, then lost, then an injected error for this function."""
        if gpu.delay_s > 0:
            time.sleep(gpu.delay_s)
        if gpu.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        code = gpu.errors.get(name)
        if code is not None:
            raise pynvml.NVMLError(code)


# The same constants and error classes as the real module (NVML_*, NVMLError_*).
for _name in dir(pynvml):
    if _name.startswith(("NVML_", "NVMLError_")) and not hasattr(FakeNvml, _name):
        setattr(FakeNvml, _name, getattr(pynvml, _name))
del _name

FUNCTIONS: tuple[str, ...] = (
    "nvmlInit",
    "nvmlShutdown",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetName",
    "nvmlDeviceGetPciInfo",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetTemperatureThreshold",
    "nvmlDeviceGetFieldValues",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetPowerManagementLimit",
    "nvmlDeviceGetPowerManagementDefaultLimit",
    "nvmlDeviceGetPowerManagementLimitConstraints",
    "nvmlDeviceSetPowerManagementLimit",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetViolationStatus",
)
"""Every pynvml function the fake implements."""


def fake_node(model: GpuModel = H100_SXM, count: int = 8, node_index: int = 0) -> FakeNvml:
    """A fake NVML for one node of `count` identical GPUs."""
    return FakeNvml(make_gpus(model, count, node_index=node_index))
