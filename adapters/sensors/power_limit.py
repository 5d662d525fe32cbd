"""Read and set GPU power limits: one interface, three ways to reach NVML.

``DirectNvmlLimiter`` calls NVML in this process (root on a dev box, or the fake);
``HelperClient`` asks the privileged helper (daemon/powercap_helper.py) over its
Unix socket, one JSON line per request; ``DryRunLimiter`` reads through another
limiter and records what it would set, changing nothing. All three refuse a limit
outside [min, default] before anything is sent (``check_request``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import orjson

from adapters.blocking import DedicatedThread
from adapters.errors import SourceUnavailable

log = logging.getLogger(__name__)

MAX_LINE_BYTES = 64 * 1024  # a reply lists every GPU of a node; a request is one short line
_CLOSE_TIMEOUT_S = 5.0

# NVML errors that retrying cannot fix: the caller must change what it asks for.
_PERMANENT = frozenset(
    {
        "NVML_ERROR_NO_PERMISSION",
        "NVML_ERROR_INVALID_ARGUMENT",
        "NVML_ERROR_NOT_SUPPORTED",
        "NVML_ERROR_LIBRARY_NOT_FOUND",
        "NVML_ERROR_DRIVER_NOT_LOADED",
    }
)


@dataclass(frozen=True, slots=True)
class GpuLimit:
    """One GPU's power limit as NVML reports it, in watts.

    ``enforced_w`` is what the board holds (the lowest of every actor's limit);
    ``requested_w`` is the power-management limit last set (by us, an admin's
    ``nvidia-smi -pl`` or the default); ``min_w``/``max_w`` are NVML's constraints.
    """

    uuid: str
    index: int
    enforced_w: float
    requested_w: float
    default_w: float
    min_w: float
    max_w: float

    @property
    def highest_settable_w(self) -> float:
        """The most rackguard may ask for: never above the default, nor NVML's maximum."""
        return min(self.default_w, self.max_w)

    def to_json(self) -> dict[str, Any]:
        """The wire form (the helper's replies)."""
        return asdict(self)

    @classmethod
    def from_json(cls, raw: object) -> GpuLimit:
        """Decode the wire form strictly; PowerLimitError (transient) on anything else."""
        if not isinstance(raw, Mapping):
            raise PowerLimitError(f"bad GPU limit in reply: {raw!r:.200}", permanent=False)
        try:
            uuid, index = raw["uuid"], raw["index"]
            watts = {k: raw[k] for k in _WATT_FIELDS}
        except KeyError as err:
            raise PowerLimitError(f"GPU limit in reply lacks {err}", permanent=False) from err
        if not isinstance(uuid, str) or type(index) is not int:
            raise PowerLimitError(f"bad GPU identity in reply: {raw!r:.200}", permanent=False)
        for key, value in watts.items():
            if type(value) not in (int, float) or not math.isfinite(value):
                raise PowerLimitError(f"bad {key} in reply: {value!r:.50}", permanent=False)
        return cls(uuid=uuid, index=index, **{k: float(v) for k, v in watts.items()})


_WATT_FIELDS = ("enforced_w", "requested_w", "default_w", "min_w", "max_w")


class PowerLimitError(Exception):
    """A limit could not be read or set.

    ``permanent``: asking again cannot help (no privilege, a bad argument, no such
    GPU, no NVML); otherwise transient (helper unreachable, NVML busy or hung).
    """

    def __init__(self, message: str, *, permanent: bool) -> None:
        super().__init__(message)
        self.permanent = permanent


class PowerLimiter(Protocol):
    """Reads and sets this node's GPU power limits."""

    async def limits(self) -> list[GpuLimit]:
        """Every GPU's limits, in NVML index order."""
        ...

    async def set_limit(self, uuid: str, watts: float) -> GpuLimit:
        """Set one GPU's power-management limit; returns its limits after the change."""
        ...

    async def close(self) -> None:
        """Release NVML or the connection; never raises."""
        ...


def check_request(limit: GpuLimit, watts: object) -> float:
    """``watts`` as a float when it is a finite number in [min_w, min(default_w, max_w)].

    PowerLimitError (permanent) naming the bound otherwise: rackguard only ever
    lowers a limit or restores it, never raises a GPU above its default.
    """
    if type(watts) not in (int, float):
        raise PowerLimitError(f"watts must be a number, got {watts!r:.50}", permanent=True)
    w = float(watts)  # type: ignore[arg-type]  # int or float, checked above
    if not math.isfinite(w):
        raise PowerLimitError(f"watts must be finite, got {w}", permanent=True)
    if w < limit.min_w:
        raise PowerLimitError(
            f"GPU {limit.uuid}: {w:g} W is below its minimum limit {limit.min_w:g} W",
            permanent=True,
        )
    if w > limit.highest_settable_w:
        raise PowerLimitError(
            f"GPU {limit.uuid}: {w:g} W is above its default limit"
            f" {limit.highest_settable_w:g} W (rackguard never raises a limit)",
            permanent=True,
        )
    return w


def find_gpu(limits: list[GpuLimit], uuid: object) -> GpuLimit:
    """The GPU with this UUID; PowerLimitError (permanent) when this node has none."""
    for limit in limits:
        if limit.uuid == uuid:
            return limit
    raise PowerLimitError(f"no GPU with uuid {uuid!r:.80} on this node", permanent=True)


class DirectNvmlLimiter:
    """PowerLimiter calling NVML in this process, on one dedicated thread.

    NVML is initialised on first use and kept until close(). Setting a limit needs
    root (NVML_ERROR_NO_PERMISSION otherwise): the daemon uses this only to read,
    or when it runs as root on a development box; the helper uses it to set.
    """

    def __init__(self, binding: Any, *, name: str = "power-limit") -> None:
        self.name = name
        self._b = binding
        self._thread = DedicatedThread(f"nvml-{name}")
        self._handles: dict[str, tuple[int, Any]] | None = None
        self._error_names: dict[int, str] = {
            value: attr
            for attr in dir(binding)
            if attr.startswith("NVML_ERROR_") and isinstance(value := getattr(binding, attr), int)
        }

    async def limits(self) -> list[GpuLimit]:
        """Every GPU's limits, in index order."""
        limits: list[GpuLimit] = await self._run(self._limits_sync)
        return limits

    async def set_limit(self, uuid: str, watts: float) -> GpuLimit:
        """Check the request against the GPU's constraints, set it, read it back."""
        after: GpuLimit = await self._run(self._set_sync, uuid, watts)
        return after

    async def close(self) -> None:
        """nvmlShutdown if initialised; skipped while a call hangs."""
        if self._handles is not None:
            self._handles = None
            try:
                async with asyncio.timeout(_CLOSE_TIMEOUT_S):
                    await self._thread.call(self._shutdown_quietly)
            except Exception:  # close never raises: busy, hung or failed changes nothing
                pass
        self._thread.close()

    async def _run(self, fn: Any, *args: Any) -> Any:
        try:
            return await self._thread.call(fn, *args)
        except SourceUnavailable as err:
            raise PowerLimitError(f"{self.name}: {err}", permanent=False) from err

    # --- everything below runs on the dedicated thread ---------------------------------

    def _limits_sync(self) -> list[GpuLimit]:
        return [self._read(uuid, index, h) for uuid, (index, h) in self._gpus().items()]

    def _set_sync(self, uuid: str, watts: float) -> GpuLimit:
        gpus = self._gpus()
        if uuid not in gpus:
            raise PowerLimitError(f"no GPU with uuid {uuid!r:.80} on this node", permanent=True)
        index, handle = gpus[uuid]
        w = check_request(self._read(uuid, index, handle), watts)
        self._nvml(self._b.nvmlDeviceSetPowerManagementLimit, handle, round(w * 1000))
        return self._read(uuid, index, handle)

    def _gpus(self) -> dict[str, tuple[int, Any]]:
        """UUID -> (index, handle), initialising NVML on first use."""
        if self._handles is None:
            b = self._b
            self._nvml(b.nvmlInit)
            try:
                handles: dict[str, tuple[int, Any]] = {}
                for i in range(int(self._nvml(b.nvmlDeviceGetCount))):
                    h = self._nvml(b.nvmlDeviceGetHandleByIndex, i)
                    raw = self._nvml(b.nvmlDeviceGetUUID, h)
                    handles[raw.decode() if isinstance(raw, bytes) else str(raw)] = (i, h)
            except BaseException:
                self._shutdown_quietly()
                raise
            self._handles = handles
        return self._handles

    def _read(self, uuid: str, index: int, handle: Any) -> GpuLimit:
        b = self._b
        low, high = self._nvml(b.nvmlDeviceGetPowerManagementLimitConstraints, handle)
        return GpuLimit(
            uuid=uuid,
            index=index,
            enforced_w=self._nvml(b.nvmlDeviceGetEnforcedPowerLimit, handle) / 1000.0,
            requested_w=self._nvml(b.nvmlDeviceGetPowerManagementLimit, handle) / 1000.0,
            default_w=self._nvml(b.nvmlDeviceGetPowerManagementDefaultLimit, handle) / 1000.0,
            min_w=low / 1000.0,
            max_w=high / 1000.0,
        )

    def _nvml(self, fn: Any, *args: Any) -> Any:
        """fn(*args), with an NVML error turned into PowerLimitError named by its code."""
        try:
            return fn(*args)
        except self._b.NVMLError as err:
            name = self._error_names.get(err.value, f"NVML_ERROR_{err.value}")
            if name in ("NVML_ERROR_UNINITIALIZED", "NVML_ERROR_GPU_IS_LOST"):
                self._handles = None  # initialise again and find the GPUs anew next time
            raise PowerLimitError(
                f"{self.name}: {fn.__name__}: {name}: {err}", permanent=name in _PERMANENT
            ) from err

    def _shutdown_quietly(self) -> None:
        with contextlib.suppress(self._b.NVMLError):
            self._b.nvmlShutdown()


class HelperClient:
    """PowerLimiter asking the privileged helper over its Unix socket.

    One connection per request (the helper is socket-activated and exits when
    idle). Unreachable, slow or garbled replies are transient errors; the helper's
    own refusals keep the permanence it states.
    """

    def __init__(self, socket_path: Path, *, timeout_s: float = 10.0) -> None:
        self.socket_path = socket_path
        self.timeout_s = timeout_s

    async def limits(self) -> list[GpuLimit]:
        """Every GPU's limits, as the helper reads them."""
        reply = await self._ask({"op": "limits"})
        raw = reply.get("limits")
        if not isinstance(raw, list):
            raise PowerLimitError("helper reply lacks 'limits'", permanent=False)
        return [GpuLimit.from_json(item) for item in raw]

    async def set_limit(self, uuid: str, watts: float) -> GpuLimit:
        """Ask the helper to set one GPU's limit; its limits after the change."""
        if not math.isfinite(watts):  # JSON has no NaN: it would arrive as null
            raise PowerLimitError(f"watts must be finite, got {watts}", permanent=True)
        reply = await self._ask({"op": "set", "uuid": uuid, "watts": watts})
        return GpuLimit.from_json(reply.get("limit"))

    async def close(self) -> None:
        """Nothing to release: every request has its own connection."""

    async def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        where = str(self.socket_path)
        try:
            async with asyncio.timeout(self.timeout_s):
                reader, writer = await asyncio.open_unix_connection(where, limit=MAX_LINE_BYTES)
                try:
                    writer.write(orjson.dumps(request) + b"\n")
                    # A refusal may come, and the helper hang up, before it reads a byte.
                    with contextlib.suppress(ConnectionError):
                        await writer.drain()
                    line = await reader.readline()
                finally:
                    writer.close()
        except TimeoutError as err:
            raise PowerLimitError(
                f"power-cap helper at {where}: no answer within {self.timeout_s:g} s",
                permanent=False,
            ) from err
        except (OSError, ValueError) as err:  # ValueError: a line over MAX_LINE_BYTES
            raise PowerLimitError(
                f"power-cap helper at {where} unreachable: {err}", permanent=False
            ) from err
        if not line:
            raise PowerLimitError(
                f"power-cap helper at {where} hung up without an answer", permanent=False
            )
        try:
            reply = orjson.loads(line)
        except orjson.JSONDecodeError as err:
            raise PowerLimitError(
                f"power-cap helper at {where}: reply is not JSON: {line[:200]!r}",
                permanent=False,
            ) from err
        if not isinstance(reply, dict):
            raise PowerLimitError(f"power-cap helper at {where}: bad reply", permanent=False)
        if reply.get("ok") is not True:
            raise PowerLimitError(
                f"power-cap helper refused: {str(reply.get('error', 'no reason given'))[:500]}",
                permanent=reply.get("permanent") is not False,
            )
        return reply


class DryRunLimiter:
    """PowerLimiter that reads through ``reader`` and never sets anything.

    ``set_limit`` checks the request as a real one would, records it in
    ``requests`` and logs it, then returns the GPU's limits unchanged.
    """

    def __init__(self, reader: PowerLimiter) -> None:
        self._reader = reader
        self.requests: list[tuple[str, float]] = []

    async def limits(self) -> list[GpuLimit]:
        """The reader's limits."""
        return await self._reader.limits()

    async def set_limit(self, uuid: str, watts: float) -> GpuLimit:
        """Record what would be set; the GPU's limits as they are."""
        current = find_gpu(await self._reader.limits(), uuid)
        w = check_request(current, watts)
        self.requests.append((uuid, w))
        log.info(
            "dry run: would set GPU %d (%s) power limit %g W -> %g W",
            current.index,
            uuid,
            current.requested_w,
            w,
        )
        return current

    async def close(self) -> None:
        """Close the reader."""
        await self._reader.close()
