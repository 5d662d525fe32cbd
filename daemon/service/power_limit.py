"""The power limiter the config asks for: none, the helper's client or NVML direct, maybe dry."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from adapters.sensors.nvml import load_binding
from adapters.sensors.power_limit import (
    DirectNvmlLimiter,
    DryRunLimiter,
    HelperClient,
    PowerLimiter,
)
from daemon.config import Config


def build_limiter(config: Config, *, nvml: Any = None) -> PowerLimiter | None:
    """None while [power_cap] is off; else its limiter, wrapped in DryRunLimiter when dry.

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
        return DryRunLimiter(limiter)
    return limiter
