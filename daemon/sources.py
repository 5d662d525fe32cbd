"""Builds adapters, the sink and policy settings from the config."""

from __future__ import annotations

from adapters.base import SchedulerSink, SensorAdapter
from adapters.schedulers.webhook import WebhookSink
from adapters.sensors.nvml import NvmlAdapter, load_binding
from daemon.config import PolicyConfig, SchedulerConfig, SourceConfig, read_secret
from policies.threshold import ThresholdSettings


def build_adapter(name: str, cfg: SourceConfig) -> SensorAdapter:
    """The adapter for one configured source."""
    return NvmlAdapter(name, load_binding(cfg.binding), gpu_indices=cfg.gpus or None)


def build_sink(cfg: SchedulerConfig) -> SchedulerSink:
    """The scheduler sink for the configured scheduler."""
    return WebhookSink(cfg.url, read_secret(cfg.secret_file), timeout_s=cfg.timeout_s)


def threshold_settings(cfg: PolicyConfig) -> ThresholdSettings:
    """The pure policy's settings from the validated config."""
    return ThresholdSettings(
        enter_margin_c=cfg.enter_margin_c,
        exit_margin_c=cfg.exit_margin_c,
        critical_margin_c=cfg.critical_margin_c,
        min_dwell_s=cfg.min_dwell_s,
        resume_after_s=cfg.resume_after_s,
        stale_after_s=cfg.stale_after_s,
        dry_run=cfg.dry_run,
    )
