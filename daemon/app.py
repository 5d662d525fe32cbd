"""The process: one TaskGroup supervising the source runners, the policy, delivery and the API."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import signal
from collections.abc import Mapping

from aiohttp import web

from adapters.base import SchedulerSink, SensorAdapter
from adapters.errors import SourceError, SourceSetupError
from daemon.api import make_app
from daemon.config import Config
from daemon.config_policy import policy_settings
from daemon.delivery import DeliveryQueue
from daemon.engine import PolicyEngine
from daemon.runner import SourceRunner
from daemon.sinks import build_sink
from daemon.sources import build_adapter
from daemon.state import StateStore

log = logging.getLogger(__name__)

STOP_GRACE_S = 4.0


class StartupError(Exception):
    """The daemon cannot start as configured; the message says why and what to do."""


class _Shutdown(Exception):
    """Raised inside the TaskGroup to unwind every task on a stop request."""


class Daemon:
    """Wires config, adapters, policy, delivery and API together.

    ``adapters`` and ``sink`` may be injected (the demo and tests pass adapters
    bound to fakes); otherwise they are built from the config.
    """

    def __init__(
        self,
        config: Config,
        *,
        adapters: Mapping[str, SensorAdapter] | None = None,
        sink: SchedulerSink | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config
        self._rng = rng or random.Random()
        self.store = StateStore()
        if adapters is None:
            adapters = {name: build_adapter(name, cfg) for name, cfg in config.sources.items()}
        self.runners = [
            SourceRunner(adapter, config.sources[name].timing, self.store.update, rng=self._rng)
            for name, adapter in adapters.items()
        ]
        if sink is None and config.scheduler is not None:
            sink = build_sink(config.scheduler)
        self.sink = sink
        sched = config.scheduler
        self.delivery = DeliveryQueue(
            sink,
            retry_initial_s=sched.retry_initial_s if sched else 1.0,
            retry_max_s=sched.retry_max_s if sched else 60.0,
            rng=self._rng,
        )
        self.engine = PolicyEngine(
            config.node.name, policy_settings(config.policy), self.store, self.delivery.submit
        )
        self._stop = asyncio.Event()
        self.api_port: int | None = None
        self.ready = asyncio.Event()

    def stop(self) -> None:
        """Ask the daemon to stop; run() returns within a few seconds."""
        self._stop.set()

    async def check_sources(self) -> None:
        """First connect of every source; a setup error (no driver, ...) stops the start.

        Transient failures are left to the runners' backoff.
        """
        for runner in self.runners:
            try:
                async with asyncio.timeout(max(runner.timing.timeout_s, 5.0)):
                    await runner.adapter.connect()
            except SourceSetupError as err:
                raise StartupError(f"source {runner.name!r}: {err}") from err
            except (SourceError, TimeoutError) as err:
                log.warning("%s: not reachable at start, will retry: %s", runner.name, err)
            finally:
                await runner.adapter.close()

    async def run(self, *, handle_signals: bool = True) -> None:
        """Run until stop() or SIGTERM/SIGINT."""
        loop = asyncio.get_running_loop()
        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._on_signal, sig)
        api = web.AppRunner(make_app(self), access_log=None, handle_signals=False)
        await api.setup()
        try:
            site = web.TCPSite(api, self.config.api.listen, self.config.api.port)
            await site.start()
            self.api_port = api.addresses[0][1]
            log.info(
                "%s: API on http://%s:%d",
                self.config.node.name,
                self.config.api.listen,
                self.api_port,
            )
            try:
                async with asyncio.TaskGroup() as tg:
                    for runner in self.runners:
                        tg.create_task(runner.run(), name=f"source:{runner.name}")
                    tg.create_task(
                        self.engine.run(self.config.policy.evaluate_interval_s), name="policy"
                    )
                    tg.create_task(self.delivery.run(), name="delivery")
                    tg.create_task(self._mark_ready(), name="ready")
                    tg.create_task(self._wait_stop(), name="stop")
            except* _Shutdown:
                pass
        finally:
            if handle_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)
            await self._shutdown(api)

    def _on_signal(self, sig: signal.Signals) -> None:
        log.info("%s received, stopping", sig.name)
        self.stop()

    async def _wait_stop(self) -> None:
        await self._stop.wait()
        raise _Shutdown

    async def _mark_ready(self) -> None:
        await asyncio.gather(*(r.first_attempt.wait() for r in self.runners))
        self.ready.set()
        log.info(
            "%s: ready: %s",
            self.config.node.name,
            ", ".join(f"{r.name} {r.health}" for r in self.runners),
        )

    async def _shutdown(self, api: web.AppRunner) -> None:
        pending = self.delivery.pending()
        if pending:
            log.warning(
                "stopping with %d undelivered decision(s): %s",
                len(pending),
                ", ".join(f"{p.decision.node} {p.decision.action}" for p in pending),
            )
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(STOP_GRACE_S):
                await api.cleanup()
                if self.sink is not None:
                    await self.sink.close()
        log.info("%s: stopped", self.config.node.name)
