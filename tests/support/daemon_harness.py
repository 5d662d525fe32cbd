"""Running a real daemon in-process against the fake NVML and the fake webhook scheduler."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path

from adapters.base import SchedulerSink
from adapters.schedulers.webhook.sink import WebhookSink
from adapters.sensors.nvml import NvmlAdapter
from daemon.app import Daemon
from daemon.config import parse_config
from fakes.nvml import FakeNvml
from fakes.scheduler import FakeWebhookScheduler
from tests.support.secrets import WEBHOOK_SECRET as SECRET

# `rackguard` on a simulated node of eight GPUs: the real command, the real NVML
# adapter, the fake NVML injected (no config setting can select it).
SIMULATED_RACKGUARD = [sys.executable, "-m", "fakes.nvml_module"]


def config_text(
    url: str,
    secret: Path,
    *,
    port: int = 0,
    api_extra: str = "",
    scheduler_extra: str = "",
) -> str:
    """A fast-polling config for one node; extra lines go into [api] and [scheduler]."""
    return f"""
[node]
name = "gpu-node-07"
rack = "rack-b"
[api]
port = {port}
{api_extra}
[sources.gpus]
type = "nvml"
interval_s = 0.05
timeout_s = 0.04
backoff_initial_s = 0.05
backoff_max_s = 0.2
[policy]
min_dwell_s = 0.0
resume_after_s = 0.2
stale_after_s = 1.0
evaluate_interval_s = 0.05
[scheduler]
type = "webhook"
url = "{url}"
secret_file = "{secret}"
retry_initial_s = 0.05
retry_max_s = 0.1
{scheduler_extra}
"""


@contextlib.asynccontextmanager
async def running_daemon(
    nvml: FakeNvml,
    receiver: FakeWebhookScheduler,
    secret: Path,
    *,
    api_extra: str = "",
    scheduler_extra: str = "",
) -> AsyncIterator[Daemon]:
    """A daemon on the fake node, delivering to the receiver; ready when yielded."""
    text = config_text(receiver.url, secret, api_extra=api_extra, scheduler_extra=scheduler_extra)
    async with running(text, nvml, sink=WebhookSink(receiver.url, SECRET)) as daemon:
        yield daemon


@contextlib.asynccontextmanager
async def running(
    text: str, nvml: FakeNvml, *, sink: SchedulerSink | None = None
) -> AsyncIterator[Daemon]:
    """A daemon of config ``text`` on the fake node (its sink from the config unless given)."""
    daemon = Daemon(parse_config(text), adapters={"gpus": NvmlAdapter("gpus", nvml)}, sink=sink)
    task = asyncio.create_task(daemon.run(handle_signals=False))
    try:
        await asyncio.wait_for(daemon.ready.wait(), 5)
        yield daemon
    finally:
        daemon.stop()
        await asyncio.wait_for(task, 5)
