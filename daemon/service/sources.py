"""Builds the sensor adapters from the config."""

from __future__ import annotations

from typing import Any

from adapters.base import SensorAdapter
from adapters.sensors.nvml import NvmlAdapter, load_binding
from daemon.config import SourceConfig
from daemon.config.opcua import OpcuaSourceConfig, build_opcua_adapter
from daemon.config.snmp import SnmpSourceConfig, build_snmp_adapter


def build_adapter(name: str, cfg: SourceConfig, *, nvml: Any = None) -> SensorAdapter:
    """The adapter for one configured source.

    ``nvml`` is an NVML binding injected by the demo and the tests (a simulated
    node); production passes None and reads nvidia-ml-py's ``pynvml``, never a
    module the config names.
    """
    if isinstance(cfg, OpcuaSourceConfig):
        return build_opcua_adapter(name, cfg)
    if isinstance(cfg, SnmpSourceConfig):
        return build_snmp_adapter(name, cfg)
    binding = nvml if nvml is not None else load_binding(cfg.binding)
    return NvmlAdapter(name, binding, gpu_indices=cfg.gpus or None)
