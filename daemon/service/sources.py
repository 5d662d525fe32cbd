"""Builds the sensor adapters from the config."""

from __future__ import annotations

from adapters.base import SensorAdapter
from adapters.sensors.nvml import NvmlAdapter, load_binding
from daemon.config import SourceConfig
from daemon.config.opcua import OpcuaSourceConfig, build_opcua_adapter
from daemon.config.snmp import SnmpSourceConfig, build_snmp_adapter


def build_adapter(name: str, cfg: SourceConfig) -> SensorAdapter:
    """The adapter for one configured source."""
    if isinstance(cfg, OpcuaSourceConfig):
        return build_opcua_adapter(name, cfg)
    if isinstance(cfg, SnmpSourceConfig):
        return build_snmp_adapter(name, cfg)
    return NvmlAdapter(name, load_binding(cfg.binding), gpu_indices=cfg.gpus or None)
