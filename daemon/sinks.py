"""Builds the scheduler sink from the config."""

from __future__ import annotations

from adapters.base import SchedulerSink
from adapters.schedulers.webhook import WebhookSink
from daemon.config_scheduler import SchedulerConfig
from daemon.secrets import read_secret


def build_sink(cfg: SchedulerConfig) -> SchedulerSink:
    """The scheduler sink for the configured scheduler."""
    return WebhookSink(cfg.url, read_secret(cfg.secret_file), timeout_s=cfg.timeout_s)
