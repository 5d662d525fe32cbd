"""SIGHUP: re-read the config and apply it atomically, or change nothing and say why.

Every new or changed source is built and connected once aside, while the
running ones keep polling; only when all of them work are the old runners
stopped and the new ones started. A refusal is one ERROR record naming the
file and every reason; the running config stays in force.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from adapters.base import SensorAdapter
from daemon.config import Config, ConfigError, load_config
from daemon.config.policy import policy_settings
from daemon.config.sources import SourceTiming
from daemon.service.build import first_connect
from daemon.service.engine import PolicyEngine
from daemon.service.logs import setup_logging
from daemon.service.notify import Notifier
from daemon.service.runner import SourceRunner
from daemon.service.source_set import SourceSet
from daemon.service.sources import build_adapter

log = logging.getLogger(__name__)

# Keys read once at start; a reload that changes them says so and keeps the old value.
_RESTART_ONLY_POLICY = ("evaluate_interval_s", "record_trace", "record_max_mb")


class ReloadRefused(Exception):
    """The new config cannot be applied; the message lists why."""


class StatusLine(Protocol):
    def line(self) -> str: ...


class Reloadable(Protocol):
    """What a reload reads and changes of the running daemon (daemon/app.py's Daemon)."""

    config: Config

    @property
    def nvml(self) -> Any: ...
    @property
    def notifier(self) -> Notifier: ...
    @property
    def status(self) -> StatusLine: ...
    @property
    def steering(self) -> object | None: ...
    @property
    def engine(self) -> PolicyEngine: ...
    @property
    def sources(self) -> SourceSet: ...
    def restore_from_outbox(self, *, only_out_of_service: bool = False) -> None: ...
    def make_runner(self, adapter: SensorAdapter, timing: SourceTiming) -> SourceRunner: ...


class Reloader:
    """Applies a config file to a running daemon, one reload at a time."""

    def __init__(self, daemon: Reloadable, path: Path | None) -> None:
        self._daemon = daemon
        self.path = path
        self._lock = asyncio.Lock()  # SIGHUPs in quick succession apply one at a time

    async def reload(self) -> bool:
        """True when the file's config is now in force; False (logged) when refused."""
        if self.path is None:
            log.warning("reload requested but the daemon was not started from a file")
            return False
        async with self._lock:
            d = self._daemon
            d.notifier.reloading()
            try:
                await self._apply(self.path)
            except ReloadRefused as err:
                log.error("reload of %s refused, keeping the running config: %s", self.path, err)
                return False
            except Exception:
                # A bug, not the operator's file: still never worth the node's protection.
                log.error(
                    "reload of %s failed, keeping the running config", self.path, exc_info=True
                )
                return False
            finally:
                d.notifier.ready(d.status.line())
            log.info("configuration reloaded from %s", self.path)
            return True

    async def _apply(self, path: Path) -> None:
        d = self._daemon
        try:
            loaded = load_config(path)
        except ConfigError as err:
            raise ReloadRefused("; ".join(err.problems)) from err
        old = d.config
        for what, a, b in (
            ("[node]", old.node, loaded.node),
            ("[api]", old.api, loaded.api),
            ("[scheduler]", old.scheduler, loaded.scheduler),
        ):
            if a != b:
                log.warning("reload: %s changed; it takes effect at the next restart", what)
        for key in _RESTART_ONLY_POLICY:
            if getattr(old.policy, key) != getattr(loaded.policy, key):
                log.warning("reload: policy.%s changed; it takes effect at the next restart", key)
        if old.cluster != loaded.cluster:
            log.warning("reload: [cluster] changed; it takes effect at the next restart")
        if old.steering.label_key != loaded.steering.label_key:
            log.warning("reload: steering.label_key changed; it takes effect at the next restart")
        steering = replace(loaded.steering, label_key=old.steering.label_key)
        if steering.enabled and d.steering is None:
            log.warning("reload: steering enabled, but the running scheduler has no node setting")
        new = Config(
            old.node,
            loaded.sources,
            loaded.logging,
            old.api,
            loaded.policy,
            old.scheduler,
            old.cluster,
            steering,
        )
        settings = policy_settings(new.policy)
        changed = {
            name
            for name in set(old.sources) | set(new.sources)
            if old.sources.get(name) != new.sources.get(name)
        }
        fresh = await self._build_aside(new, sorted(changed & set(new.sources)))
        # Everything is built and reachable: from here on nothing can fail half-way.
        setup_logging(new.logging.level, new.logging.format)
        d.engine.settings = settings
        if old.policy.dry_run != new.policy.dry_run:
            # A dry-run "drain" moved the policy's state without sending anything:
            # start again from what the scheduler was really asked for.
            d.restore_from_outbox()
        d.config = new
        await d.sources.swap(changed, set(new.sources), fresh)

    async def _build_aside(self, new: Config, names: list[str]) -> list[SourceRunner]:
        """Runners for ``names``, each adapter built and connected once; else ReloadRefused."""
        d = self._daemon
        runners: list[SourceRunner] = []
        problems: list[str] = []
        for name in names:
            cfg = new.sources[name]
            try:
                adapter = build_adapter(name, cfg, nvml=d.nvml)
            except Exception as err:
                problems.append(f"sources.{name}: cannot build: {err}")
                continue
            try:
                await first_connect(adapter, cfg)
            except TimeoutError:
                problems.append(f"sources.{name}: no answer to a first connect")
                continue
            except Exception as err:
                problems.append(f"sources.{name}: cannot connect: {err or type(err).__name__}")
                continue
            runners.append(d.make_runner(adapter, cfg.timing))
        if problems:
            raise ReloadRefused("; ".join(problems))
        return runners
