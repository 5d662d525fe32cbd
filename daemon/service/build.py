"""The build step: adapters from the config, and the first connect that proves one works."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from adapters.base import SensorAdapter
from adapters.errors import SourceUnavailable
from adapters.timeouts import time_limit
from daemon.config import Config, SourceConfig
from daemon.loops import stop_requested
from daemon.service.sources import build_adapter

# A first connect may take longer than a poll (an OPC-UA session, NVML's init).
FIRST_CONNECT_MIN_S = 5.0


def build_adapters(
    config: Config, *, injected: Mapping[str, SensorAdapter] | None = None, nvml: Any = None
) -> dict[str, SensorAdapter]:
    """One adapter per configured source; injected ones stand in for theirs by name."""
    built = dict(injected or {})
    for name, cfg in config.sources.items():
        if name not in built:
            built[name] = build_adapter(name, cfg, nvml=nvml)
    return built


async def first_connect(adapter: SensorAdapter, cfg: SourceConfig) -> None:
    """Connect once and close again; raises what connect() raised, or TimeoutError.

    A library's CancelledError that no one asked for is SourceUnavailable: it would
    end a reload without a word (neither applied nor refused), or the daemon's start.
    """
    try:
        async with time_limit(max(cfg.timeout_s, FIRST_CONNECT_MIN_S)):
            await adapter.connect()
    except asyncio.CancelledError as err:
        if stop_requested():
            raise
        raise SourceUnavailable(
            f"{adapter.name}: connect ended by a cancellation no one asked for"
        ) from err
    finally:
        await adapter.close()
