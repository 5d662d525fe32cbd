"""NVML adapter: per-GPU temperatures, thermal thresholds, power, clock-event reasons and
the thermal violation counter.

Every NVML call goes through ``binding.<function>`` (the pynvml module, or the fake
in fakes/nvml.py) and runs on one DedicatedThread, so a hung driver never blocks the
event loop and never piles up threads. A poll is one call onto that thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import time
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from adapters.blocking import DedicatedThread
from adapters.errors import SourceMismatch, SourceSetupError, SourceUnavailable
from policies.model import Quality, Reading, SensorKind

log = logging.getLogger(__name__)

# Slots of the readings each GPU yields, in output order (the last only where supported).
_TEMP, _MEM, _SLOWDOWN, _SHUTDOWN, _MAX_OP, _POWER, _LIMIT, _CLOCK, _THERMAL_VIOLATION = range(9)

# (sensor id suffix, kind, unit, lowest sane value, highest sane value) per slot.
_SENSORS: tuple[tuple[str, SensorKind, str, float, float], ...] = (
    ("temperature", SensorKind.GPU_TEMPERATURE, "celsius", -40.0, 150.0),
    ("memory_temperature", SensorKind.GPU_MEMORY_TEMPERATURE, "celsius", -40.0, 150.0),
    ("slowdown_threshold", SensorKind.GPU_SLOWDOWN_THRESHOLD, "celsius", -40.0, 150.0),
    ("shutdown_threshold", SensorKind.GPU_SHUTDOWN_THRESHOLD, "celsius", -40.0, 150.0),
    ("max_operating_threshold", SensorKind.GPU_MAX_OPERATING_THRESHOLD, "celsius", -40.0, 150.0),
    # No board draws 10 kW; a wrapped-around counter (4.29 MW) must not pass.
    ("power", SensorKind.GPU_POWER, "watts", 0.0, 10_000.0),
    ("power_limit", SensorKind.GPU_POWER_LIMIT, "watts", 0.0, 10_000.0),
    ("clock_event_reasons", SensorKind.GPU_CLOCK_EVENT_REASONS, "bitmask", 0.0, 2.0**64),
    # nvmlDeviceGetViolationStatus(NVML_PERF_POLICY_THERMAL): cumulative ns, as seconds.
    ("thermal_violation", SensorKind.GPU_THERMAL_VIOLATION, "seconds", 0.0, 2.0**64 / 1e9),
)

# How far the violation counter may run ahead of our own clock between two polls: the
# driver updates it on its own tick, so its interval and ours need not line up exactly.
VIOLATION_SKEW_S = 0.5
# Errors meaning this GPU has no violation counter: stop asking, count from clock reasons.
_NO_VIOLATION_COUNTER = frozenset({"NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_FUNCTION_NOT_FOUND"})

# nvmlClocksEventReason* bits (NVML ABI, identical to the older ClocksThrottleReason*).
CLOCK_EVENT_REASONS: tuple[tuple[int, str], ...] = (
    (0x001, "gpu_idle"),
    (0x002, "applications_clocks_setting"),
    (0x004, "sw_power_cap"),
    (0x008, "hw_slowdown"),
    (0x010, "sync_boost"),
    (0x020, "sw_thermal_slowdown"),
    (0x040, "hw_thermal_slowdown"),
    (0x080, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
    (0x200, "board_limit"),
    (0x400, "reliability"),
)

# nvmlInit failures that retrying cannot fix, with what the operator should do.
_SETUP_HINTS: dict[str, str] = {
    "NVML_ERROR_LIBRARY_NOT_FOUND": (
        "libnvidia-ml.so.1 not found: is the NVIDIA driver installed? It ships the library;"
        " in a container, make the driver libraries visible (NVIDIA container toolkit)"
    ),
    "NVML_ERROR_DRIVER_NOT_LOADED": (
        "NVIDIA kernel driver not loaded: check `nvidia-smi` and `lsmod | grep nvidia`,"
        " then load it (`modprobe nvidia`) or reinstall the driver"
    ),
    "NVML_ERROR_NO_PERMISSION": (
        "no permission to /dev/nvidia*: run rackguard as a user that may open the NVIDIA"
        " device nodes (root or their owning group) and allow them in its device cgroup"
    ),
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": (
        "NVML library and NVIDIA kernel driver versions differ (driver upgraded without a"
        " reload): reboot the node or reload the nvidia kernel modules"
    ),
}

# Errors meaning NVML as a whole is gone: the read fails so the runner reconnects.
_LIBRARY_GONE = frozenset(
    {
        "NVML_ERROR_UNINITIALIZED",
        "NVML_ERROR_DRIVER_NOT_LOADED",
        "NVML_ERROR_LIBRARY_NOT_FOUND",
        "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
    }
)
# Errors after which the old throttle-reasons call is tried instead.
_CLOCK_FALLBACK = frozenset({"NVML_ERROR_FUNCTION_NOT_FOUND", "NVML_ERROR_NOT_SUPPORTED"})

# c_nvmlValue_t member holding each NVML_VALUE_TYPE_<suffix>.
_VALUE_MEMBERS: tuple[tuple[str, str], ...] = (
    ("DOUBLE", "dVal"),
    ("UNSIGNED_INT", "uiVal"),
    ("UNSIGNED_LONG", "ulVal"),
    ("UNSIGNED_LONG_LONG", "ullVal"),
    ("SIGNED_LONG_LONG", "sllVal"),
    ("SIGNED_INT", "siVal"),
    ("UNSIGNED_SHORT", "usVal"),
)

_UNKNOWN = "unknown"
_CLOSE_TIMEOUT_S = 5.0  # close() must not hang on a hung driver


def load_binding(module_name: str = "pynvml") -> Any:
    """Import the NVML binding module; SourceSetupError when it is not installed."""
    try:
        return importlib.import_module(module_name)
    except ImportError as err:
        raise SourceSetupError(
            f"cannot import {module_name!r}: the nvidia-ml-py package is missing;"
            f" install it into rackguard's virtual environment (pip install nvidia-ml-py)"
        ) from err


def decode_clock_event_reasons(mask: int) -> str:
    """Comma-separated names of the active bits, e.g. 'hw_slowdown,sw_thermal_slowdown'."""
    names = [name for bit, name in CLOCK_EVENT_REASONS if mask & bit]
    known = 0
    for bit, _ in CLOCK_EVENT_REASONS:
        known |= bit
    if mask & ~known:
        names.append(f"unknown_0x{mask & ~known:x}")
    return ",".join(names)


def _violation_step(previous: tuple[float, int], mono: float, ns: int) -> _Failure | None:
    """Why a violation counter's step from ``previous`` cannot be true, or None."""
    since, before = previous
    step_s = (ns - before) / 1e9
    if step_s < 0:
        return _Failure("", f"violation counter went backwards by {-step_s:.3f} s (reset?)")
    elapsed = mono - since
    if step_s > elapsed + VIOLATION_SKEW_S:
        return _Failure(
            "", f"violation counter advanced {step_s:.3f} s in {elapsed:.3f} s of wall time"
        )
    return None


def _text(raw: object) -> str:
    """NVML strings as str: older pynvml returns bytes."""
    if isinstance(raw, bytes):
        return raw.decode("utf-8", "replace")
    return str(raw)


@dataclass(frozen=True, slots=True)
class _Failure:
    """An NVML error turned into a reading's reason; one cached instance per code."""

    name: str
    reason: str


class _GpuLost(Exception):
    """GPU_IS_LOST from any call: every reading of that GPU is BAD."""

    def __init__(self, failure: _Failure) -> None:
        super().__init__(failure.reason)
        self.failure = failure


@dataclass(slots=True)
class _NvmlGpu:
    """What connect() learned about one GPU; thresholds and identity are cached here."""

    index: int
    ids: tuple[str, ...]
    labels: Mapping[str, str]
    handle: Any = None
    fault: str = "not set up"  # why there is no handle; "" once set up
    thresholds: dict[int, float | _Failure] = field(default_factory=dict)
    clock_labels: dict[int, Mapping[str, str]] = field(default_factory=dict)
    has_violation_counter: bool = True  # False after NOT_SUPPORTED, until reconnect
    last_violation: tuple[float, int] | None = None  # (mono, violationTime ns) last read

    @classmethod
    def new(cls, index: int) -> _NvmlGpu:
        """A GPU before setup: ids fixed, identity unknown."""
        return cls(
            index=index,
            ids=tuple(f"gpu{index}.{suffix}" for suffix, *_ in _SENSORS),
            labels=_labels(index, _UNKNOWN, _UNKNOWN, _UNKNOWN),
        )


def _labels(
    index: int, uuid: str, bus_id: str, name: str, driver: str = _UNKNOWN
) -> Mapping[str, str]:
    """Read-only identity labels shared by all readings of one GPU."""
    return types.MappingProxyType(
        {
            "gpu": str(index),
            "uuid": uuid,
            "pci_bus_id": bus_id,
            "name": name,
            "driver_version": driver,
        }
    )


class NvmlAdapter:
    """SensorAdapter for the GPUs of this node through NVML.

    read() before connect() raises SourceUnavailable. A failing GPU or field is a BAD
    reading with the NVML error's name; an error meaning NVML itself is gone
    (uninitialised, driver unloaded) raises SourceUnavailable so the runner reconnects.
    A GPU whose handle failed at connect is retried on each read. The clock-reasons
    call (new API, else the deprecated throttle one) is chosen by its first success
    after connect and then kept.
    """

    def __init__(
        self, name: str, binding: Any, *, gpu_indices: Sequence[int] | None = None
    ) -> None:
        self.name = name
        self._b = binding
        self._requested = None if gpu_indices is None else tuple(dict.fromkeys(gpu_indices))
        self._thread = DedicatedThread(f"nvml-{name}")
        self._gpus: list[_NvmlGpu] | None = None
        self._error_names: dict[int, str] = {
            value: attr
            for attr in dir(binding)
            if attr.startswith("NVML_ERROR_") and isinstance(value := getattr(binding, attr), int)
        }
        self._failures: dict[int, _Failure] = {}
        self._success: int = binding.NVML_SUCCESS
        self._mem_fields: list[int] = [binding.NVML_FI_DEV_MEMORY_TEMP]
        # Union member per NVML_VALUE_TYPE_*; an older binding may lack the newer types.
        self._value_attrs: dict[int, str] = {
            getattr(binding, f"NVML_VALUE_TYPE_{suffix}"): member
            for suffix, member in _VALUE_MEMBERS
            if hasattr(binding, f"NVML_VALUE_TYPE_{suffix}")
        }
        self._temp_sensor: int = binding.NVML_TEMPERATURE_GPU
        self._threshold_types: tuple[tuple[int, int], ...] = (
            (_SLOWDOWN, binding.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
            (_SHUTDOWN, binding.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN),
            (_MAX_OP, binding.NVML_TEMPERATURE_THRESHOLD_GPU_MAX),
        )
        # The clock-reasons call that worked; None until the first success after connect.
        self._clock_fn: Callable[[Any], Any] | None = None
        self._driver = _UNKNOWN  # the driver version, read at each connect
        self._thermal_policy: int = binding.NVML_PERF_POLICY_THERMAL
        self._violation_logged: set[int] = set()  # GPU indices told "no counter", once each

    @property
    def busy(self) -> bool:
        """True while an abandoned (timed-out) NVML call is still running."""
        return self._thread.busy

    async def connect(self) -> None:
        """nvmlInit, select GPUs, read identity and thresholds; a second call reconnects."""
        if self._gpus is not None:
            await self.close()
        self._gpus = await self._thread.call(self._connect_sync)

    async def read(self) -> Sequence[Reading]:
        """Eight or nine readings per selected GPU; SourceUnavailable when not connected or busy."""
        gpus = self._gpus
        if gpus is None:
            raise SourceUnavailable(f"{self.name}: not connected; call connect() first")
        return await self._thread.call(self._poll, gpus, time.monotonic(), time.time())

    async def close(self) -> None:
        """nvmlShutdown if connected, errors ignored; skipped at once while a call hangs."""
        if self._gpus is not None:
            self._gpus = None
            try:
                async with asyncio.timeout(_CLOSE_TIMEOUT_S):
                    await self._thread.call(self._shutdown_quietly)
            except Exception:  # close never raises; busy, hung or failed changes nothing here
                pass
        self._thread.close()

    # --- everything below runs on the dedicated thread ---------------------------------

    def _connect_sync(self) -> list[_NvmlGpu]:
        """Blocking connect; raises SourceSetupError / SourceUnavailable with the cause."""
        b = self._b
        try:
            b.nvmlInit()
        except b.NVMLError as err:
            failure = self._failure(err.value)
            hint = _SETUP_HINTS.get(failure.name)
            if hint is not None:
                raise SourceSetupError(f"{self.name}: {hint} [{failure.reason}]") from err
            raise SourceUnavailable(f"{self.name}: nvmlInit failed: {failure.reason}") from err
        try:
            count = int(b.nvmlDeviceGetCount())
            if count == 0:
                raise SourceSetupError(
                    f"{self.name}: NVML sees no GPUs on this node: check `nvidia-smi`"
                )
            indices = range(count) if self._requested is None else self._requested
            missing = [i for i in indices if not 0 <= i < count]
            if missing:
                raise SourceMismatch(
                    f"{self.name}: gpu_indices {missing} do not exist:"
                    f" this node has {count} GPUs (0..{count - 1})"
                )
            self._clock_fn = None
            self._driver = self._driver_version()
            gpus = [_NvmlGpu.new(i) for i in indices]
            for gpu in gpus:
                self._setup(gpu)
            return gpus
        except b.NVMLError as err:
            self._shutdown_quietly()
            reason = self._failure(err.value).reason
            raise SourceUnavailable(f"{self.name}: NVML setup failed: {reason}") from err
        except BaseException:
            self._shutdown_quietly()
            raise

    def _driver_version(self) -> str:
        """The NVIDIA driver's version ("unknown" when NVML cannot say)."""
        try:
            return _text(self._b.nvmlSystemGetDriverVersion())
        except (self._b.NVMLError, AttributeError):  # AttributeError: a binding without it
            return _UNKNOWN

    def _shutdown_quietly(self) -> None:
        """nvmlShutdown, ignoring its errors."""
        with contextlib.suppress(self._b.NVMLError):
            self._b.nvmlShutdown()

    def _setup(self, gpu: _NvmlGpu) -> None:
        """Get the handle, identity and thresholds of one GPU; on failure record why."""
        b = self._b
        try:
            handle = self._call(b.nvmlDeviceGetHandleByIndex, gpu.index)
            if isinstance(handle, _Failure):
                gpu.fault = handle.reason
                return
            uuid = self._call(b.nvmlDeviceGetUUID, handle)
            pci = self._call(b.nvmlDeviceGetPciInfo, handle)
            model = self._call(b.nvmlDeviceGetName, handle)
            gpu.labels = _labels(
                gpu.index,
                _UNKNOWN if isinstance(uuid, _Failure) else _text(uuid),
                _UNKNOWN if isinstance(pci, _Failure) else _text(pci.busId),
                _UNKNOWN if isinstance(model, _Failure) else _text(model),
                self._driver,
            )
            gpu.thresholds = {
                slot: self._number(self._call(b.nvmlDeviceGetTemperatureThreshold, handle, kind))
                for slot, kind in self._threshold_types
            }
        except _GpuLost as lost:
            gpu.fault = lost.failure.reason
            return
        gpu.clock_labels = {}
        gpu.handle, gpu.fault = handle, ""

    def _poll(self, gpus: list[_NvmlGpu], mono: float, wall: float) -> list[Reading]:
        """One blocking poll of every selected GPU."""
        b = self._b
        out: list[Reading] = []
        for gpu in gpus:
            if gpu.handle is None:
                self._setup(gpu)  # retry what failed at connect
                if gpu.handle is None:
                    self._all_bad(out, gpu, gpu.fault, mono, wall)
                    continue
            start = len(out)
            h = gpu.handle
            try:
                self._retry_thresholds(gpu, h)
                temp = self._call(b.nvmlDeviceGetTemperature, h, self._temp_sensor)
                self._emit(out, gpu, _TEMP, self._number(temp), mono, wall)
                self._emit_memory_temperature(out, gpu, mono, wall)
                for slot, _ in self._threshold_types:
                    self._emit(out, gpu, slot, gpu.thresholds[slot], mono, wall)
                power = self._call(b.nvmlDeviceGetPowerUsage, h)
                self._emit(out, gpu, _POWER, self._number(power, 0.001), mono, wall)
                limit = self._call(b.nvmlDeviceGetEnforcedPowerLimit, h)
                self._emit(out, gpu, _LIMIT, self._number(limit, 0.001), mono, wall)
                self._emit_clock_reasons(out, gpu, mono, wall)
                self._emit_thermal_violation(out, gpu, mono, wall)
            except _GpuLost as lost:
                del out[start:]
                self._all_bad(out, gpu, lost.failure.reason, mono, wall)
        return out

    def _retry_thresholds(self, gpu: _NvmlGpu, handle: Any) -> None:
        """Read again any threshold that failed transiently (not NotSupported).

        Thresholds are read once at connect; without this a one-off error there
        would leave the GPU UNKNOWN until the source reconnects.
        """
        for slot, kind in self._threshold_types:
            cached = gpu.thresholds[slot]
            if isinstance(cached, _Failure) and cached.name != "NVML_ERROR_NOT_SUPPORTED":
                fresh = self._call(self._b.nvmlDeviceGetTemperatureThreshold, handle, kind)
                gpu.thresholds[slot] = self._number(fresh)

    def _emit_memory_temperature(
        self, out: list[Reading], gpu: _NvmlGpu, mono: float, wall: float
    ) -> None:
        """Memory temperature from the field-values API, checking the field's own status."""
        values = self._call(self._b.nvmlDeviceGetFieldValues, gpu.handle, self._mem_fields)
        if isinstance(values, _Failure):
            self._emit(out, gpu, _MEM, values, mono, wall)
            return
        fv = values[0]
        status = int(fv.nvmlReturn)
        if status != self._success:
            failure = self._failure(status)
            if failure.name == "NVML_ERROR_GPU_IS_LOST":
                raise _GpuLost(failure)
            self._emit(out, gpu, _MEM, failure, mono, wall)
            return
        attr = self._value_attrs.get(int(fv.valueType))
        if attr is None:
            bad = _Failure("", f"unexpected NVML value type {int(fv.valueType)}")
            self._emit(out, gpu, _MEM, bad, mono, wall)
            return
        device_ts = fv.timestamp / 1e6 if fv.timestamp > 0 else None  # microseconds
        self._emit(out, gpu, _MEM, float(getattr(fv.value, attr)), mono, wall, device_ts)

    def _emit_clock_reasons(
        self, out: list[Reading], gpu: _NvmlGpu, mono: float, wall: float
    ) -> None:
        """Clock-event reasons bitmask, with the decoded names in label ``active``."""
        fn = self._clock_fn
        mask = self._call(fn, gpu.handle) if fn is not None else self._resolve_clock(gpu.handle)
        if isinstance(mask, _Failure):
            self._emit(out, gpu, _CLOCK, mask, mono, wall)
            return
        bits = int(mask)
        labels = gpu.clock_labels.get(bits)
        if labels is None:
            labels = types.MappingProxyType(
                {**gpu.labels, "active": decode_clock_event_reasons(bits)}
            )
            gpu.clock_labels[bits] = labels
        self._emit(out, gpu, _CLOCK, float(bits), mono, wall, labels=labels)

    def _emit_thermal_violation(
        self, out: list[Reading], gpu: _NvmlGpu, mono: float, wall: float
    ) -> None:
        """NVML's thermal violation counter, in seconds, judged against the previous read.

        A counter that went backwards (a driver reload, garbage) or advanced more than
        the time elapsed since the previous read is BAD with the reason; the raw value
        is still the base the next read is judged against. NOT_SUPPORTED means no
        reading from this GPU until reconnect, logged once per GPU.
        """
        fn = getattr(self._b, "nvmlDeviceGetViolationStatus", None)
        if not gpu.has_violation_counter:
            return
        status = (
            _Failure("NVML_ERROR_FUNCTION_NOT_FOUND", "the binding has no violation status")
            if fn is None
            else self._call(fn, gpu.handle, self._thermal_policy)
        )
        if isinstance(status, _Failure):
            if status.name in _NO_VIOLATION_COUNTER:
                gpu.has_violation_counter = False
                if gpu.index not in self._violation_logged:
                    self._violation_logged.add(gpu.index)
                    log.info(
                        "%s: gpu %d has no NVML thermal violation counter (%s): its throttled"
                        " seconds come from the clock event reasons",
                        self.name,
                        gpu.index,
                        status.reason,
                    )
                return
            gpu.last_violation = None
            self._emit(out, gpu, _THERMAL_VIOLATION, status, mono, wall)
            return
        ns = int(status.violationTime)
        previous, gpu.last_violation = gpu.last_violation, (mono, ns)
        value: float | _Failure = ns / 1e9
        if previous is not None:
            value = _violation_step(previous, mono, ns) or value
        ref_us = int(status.referenceTime)
        device_ts = ref_us / 1e6 if ref_us > 0 else None
        self._emit(out, gpu, _THERMAL_VIOLATION, value, mono, wall, device_ts)

    def _resolve_clock(self, handle: Any) -> Any:
        """Try the new clock-events call, then the old throttle call; remember the winner."""
        b = self._b
        candidates: list[Callable[[Any], Any]] = []
        new = getattr(b, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if new is not None:
            candidates.append(new)
        candidates.append(b.nvmlDeviceGetCurrentClocksThrottleReasons)
        result: Any = None
        for fn in candidates:
            result = self._call(fn, handle)
            if not isinstance(result, _Failure):
                self._clock_fn = fn
                return result
            if result.name not in _CLOCK_FALLBACK:
                return result
        return result

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args), or a _Failure for an NVML error; raises _GpuLost / SourceUnavailable."""
        try:
            return fn(*args)
        except self._b.NVMLError as err:
            failure = self._failure(err.value)
            if failure.name == "NVML_ERROR_GPU_IS_LOST":
                raise _GpuLost(failure) from err
            if failure.name in _LIBRARY_GONE:
                raise SourceUnavailable(
                    f"{self.name}: NVML stopped answering: {failure.reason}"
                ) from err
            return failure

    @staticmethod
    def _number(raw: Any, scale: float = 1.0) -> float | _Failure:
        """A numeric NVML result as float (scaled), passing failures through."""
        return raw if isinstance(raw, _Failure) else float(raw) * scale

    def _failure(self, code: int) -> _Failure:
        """The cached _Failure for an NVML return code, named like NVML_ERROR_GPU_IS_LOST."""
        failure = self._failures.get(code)
        if failure is None:
            name = self._error_names.get(code, f"NVML_ERROR_{code}")
            try:
                text = str(self._b.NVMLError(code))
            except Exception:  # message lookup itself failed: the name is enough
                text = ""
            failure = _Failure(name, f"{name}: {text}" if text else name)
            self._failures[code] = failure
        return failure

    def _emit(
        self,
        out: list[Reading],
        gpu: _NvmlGpu,
        slot: int,
        value: float | _Failure,
        mono: float,
        wall: float,
        device_ts: float | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> None:
        """Append one reading: GOOD when the value is sane, else BAD with the reason."""
        _, kind, unit, low, high = _SENSORS[slot]
        if isinstance(value, _Failure):
            reading_value, quality, reason = None, Quality.BAD, value.reason
        elif low <= value <= high:  # also rejects NaN
            reading_value, quality, reason = value, Quality.GOOD, ""
        else:
            reading_value, quality, reason = None, Quality.BAD, f"out of range: {value:g} {unit}"
        out.append(
            Reading(
                source=self.name,
                sensor=gpu.ids[slot],
                kind=kind,
                value=reading_value,
                unit=unit,
                quality=quality,
                mono=mono,
                wall=wall,
                reason=reason,
                device_ts=device_ts,
                labels=gpu.labels if labels is None else labels,
            )
        )

    def _all_bad(
        self, out: list[Reading], gpu: _NvmlGpu, reason: str, mono: float, wall: float
    ) -> None:
        """Every reading of one GPU as BAD with the same reason."""
        failure = _Failure("", reason)
        for slot in range(len(_SENSORS)):
            self._emit(out, gpu, slot, failure, mono, wall)
