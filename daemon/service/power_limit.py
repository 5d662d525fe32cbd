"""The power limiter the config asks for: none, the helper's client or NVML direct, maybe dry."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from adapters.sensors.nvml import load_binding
from adapters.sensors.power_limit import (
    DirectNvmlLimiter,
    DryRunLimiter,
    GpuLimit,
    HelperClient,
    PowerLimiter,
)
from daemon.config import Config


class WatchedLimiter:
    """A PowerLimiter that keeps the last limits it read or set, for /metrics and the API."""

    def __init__(self, inner: PowerLimiter) -> None:
        self.inner = inner
        self._latest: dict[str, GpuLimit] = {}

    async def limits(self) -> list[GpuLimit]:
        """The inner limiter's limits, remembered."""
        found = await self.inner.limits()
        self._latest = {g.uuid: g for g in found}
        return found

    async def set_limit(self, uuid: str, watts: float) -> GpuLimit:
        """Set through the inner limiter; the state after is remembered."""
        after = await self.inner.set_limit(uuid, watts)
        self._latest[uuid] = after
        return after

    async def close(self) -> None:
        """Close the inner limiter."""
        await self.inner.close()

    def latest(self) -> list[GpuLimit]:
        """The last limits seen, by GPU index (empty before the first read)."""
        return sorted(self._latest.values(), key=lambda g: g.index)


def build_limiter(config: Config, *, nvml: Any = None) -> WatchedLimiter | None:
    """None while [power_cap] is off; else its limiter (DryRunLimiter inside when dry).

    The result keeps the last limits it saw: ``PowerCapCollector(limiter.latest)``
    (daemon/http/power_cap_metrics.py) exports them.

    ``nvml`` is the binding injected by the fakes (as for the NVML source); without
    it ``via = "direct"`` loads pynvml (SourceSetupError when it is not installed).
    A dry limiter still reads the limits through the configured path: reading needs
    no privilege, and a dry run that cannot read would report nothing worth having.
    """
    cap = config.power_cap
    if not cap.enabled:
        return None
    limiter: PowerLimiter
    if cap.via == "helper":
        limiter = HelperClient(Path(cap.helper_socket), timeout_s=cap.helper_timeout_s)
    else:
        limiter = DirectNvmlLimiter(nvml if nvml is not None else load_binding(), name="power-cap")
    if cap.effective_dry_run(config.policy.dry_run):
        limiter = DryRunLimiter(limiter)
    return WatchedLimiter(limiter)
