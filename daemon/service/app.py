"""The process: one TaskGroup supervising the source runners, the policy, delivery and the API."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import signal
import sqlite3
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from aiohttp import web

from adapters.base import SchedulerSink, SensorAdapter
from adapters.errors import SourceError, SourceSetupError
from adapters.schedulers.base import ReadableSink
from adapters.schedulers.decision_json import assessment_to_dict, decision_to_dict
from adapters.schedulers.kubernetes import KubeAuthError
from daemon.cluster.build import FleetCollector, build_fleet, build_leader, run_fleet
from daemon.config import Config, ConfigError, load_config, read_secret
from daemon.config.policy import policy_settings
from daemon.delivery.deliverer import Deliverer
from daemon.delivery.outbox import DecisionStore, OutboxBusy, OutboxRefused, Status, outbox_location
from daemon.delivery.overrides import OverrideRequest, OverrideStore
from daemon.delivery.reconcile import Reconciler
from daemon.delivery.sinks import build_sink
from daemon.http.api import make_app
from daemon.http.events import EventHub
from daemon.http.metrics import Metrics
from daemon.replay.recorder import TraceRecorder
from daemon.service.engine import PolicyEngine
from daemon.service.logs import setup_logging
from daemon.service.notify import Notifier
from daemon.service.runner import SourceRunner
from daemon.service.sources import build_adapter
from daemon.service.state import StateStore
from policies.model import Action, Decision, FaultDomain, Reading

log = logging.getLogger(__name__)

STOP_GRACE_S = 4.0
STATUS_INTERVAL_S = 5.0


class StartupError(Exception):
    """The daemon cannot start as configured; the message says why and what to do."""


class _Shutdown(Exception):
    """Raised inside the TaskGroup to unwind every task on a stop request."""


class Daemon:
    """Wires config, adapters, policy, delivery and API together.

    ``adapters`` and ``sink`` may be injected (the demo and tests pass adapters
    bound to fakes); configured sources not injected are built from the config. ``config_path``
    is re-read on SIGHUP.
    """

    def __init__(
        self,
        config: Config,
        *,
        adapters: Mapping[str, SensorAdapter] | None = None,
        sink: SchedulerSink | None = None,
        rng: random.Random | None = None,
        config_path: Path | None = None,
        notifier: Notifier | None = None,
    ) -> None:
        self.config = config
        self.config_path = config_path
        self._rng = rng or random.Random()
        self.notifier = notifier or Notifier()
        self.store = StateStore()
        self.recorder = (
            TraceRecorder(
                Path(config.policy.record_trace),
                config.node.name,
                config.node.rack,
                max_bytes=int(config.policy.record_max_mb * 2**20),
            )
            if config.policy.record_trace
            else None
        )
        self.metrics = Metrics(self)
        # Injected adapters stand in for the configured sources of the same name;
        # every other configured source is built from the config.
        built = dict(adapters or {})
        for name, cfg in config.sources.items():
            if name not in built:
                built[name] = build_adapter(name, cfg)
        self.runners = [self._runner(adapter) for adapter in built.values()]
        if sink is None and config.scheduler is not None:
            try:
                sink = build_sink(config.scheduler)
            except KubeAuthError as err:
                raise StartupError(f"scheduler: {err}") from err
        self.sink = sink
        sched = config.scheduler
        try:
            self.decisions = DecisionStore(outbox_location(sched.outbox_path if sched else None))
        except (OutboxBusy, OutboxRefused, sqlite3.Error, OSError) as err:
            raise StartupError(f"scheduler.outbox_path: {err}") from err
        self.deliverer = Deliverer(
            self.decisions,
            sink,
            retry_initial_s=sched.retry_initial_s if sched else 1.0,
            retry_max_s=sched.retry_max_s if sched else 60.0,
            rng=self._rng,
        )
        self.reconciler: Reconciler | None = None
        if sched is not None and sched.reconcile_interval_s > 0 and isinstance(sink, ReadableSink):
            self.reconciler = Reconciler(
                self.decisions, sink, interval_s=sched.reconcile_interval_s
            )
        self.engine = PolicyEngine(
            config.node.name,
            policy_settings(config.policy),
            self.store,
            self._on_decision,
            rack=config.node.rack,
        )
        # After a restart, the policy starts from what it last asked for: a node
        # drained before the restart is resumed by the rule, not forgotten.
        self._restore_from_outbox(only_out_of_service=True)
        self.fleet = build_fleet(config, sink, self.engine, self._rng)
        if self.fleet is not None:
            self.metrics.registry.register(FleetCollector(self.fleet))
        self.leader = build_leader(
            self.fleet, lambda: self.config, lambda: self.runners, self._on_readings
        )
        self.deliverer.on_settled = self._on_settled
        self.events = EventHub()
        self.overrides = OverrideStore(self.decisions)
        self.engine.overrides = self.overrides.to_policy()
        self.api_token = read_secret(config.api.token_file) if config.api.token_file else None
        self._stop = asyncio.Event()
        self._reload_lock = asyncio.Lock()
        self._tg: asyncio.TaskGroup | None = None
        self._runner_tasks: dict[str, asyncio.Task[None]] = {}
        self.api_port: int | None = None
        self.ready = asyncio.Event()

    def _restore_from_outbox(self, *, only_out_of_service: bool = False) -> None:
        intent = self.decisions.intents().get(self.config.node.name)
        action = intent.action if intent is not None else Action.RESUME
        if action is Action.RESUME and only_out_of_service:
            return
        # The domain matters: a node drained for the cooling loop waits for fresh
        # loop evidence before it can be called healthy again.
        domain = intent.domain if intent is not None else FaultDomain.NONE
        self.engine.restore(action, time.monotonic(), domain=domain)

    def _runner(self, adapter: SensorAdapter) -> SourceRunner:
        timing = self.config.sources[adapter.name].timing
        return SourceRunner(
            adapter, timing, self._on_readings, rng=self._rng, on_attempt=self.metrics.observe_poll
        )

    def _on_readings(self, source: str, readings: Sequence[Reading]) -> None:
        self.store.update(source, readings)
        if self.leader is not None:
            self.leader.on_readings(source, readings)
        if self.recorder is not None:
            self.recorder.record(source, readings)

    def _on_decision(self, decision: Decision) -> None:
        self.metrics.count_decision(decision)
        self.decisions.submit(decision)  # durable (or held in memory) before it is sent
        self.events.publish("decision", decision_to_dict(decision))

    def _on_settled(self, decision: Decision, status: Status, outcome: str) -> None:
        self.events.publish(
            "delivery",
            {
                "node": decision.node,
                "action": decision.action.value,
                "key": decision.key,
                "status": status.value,
                "outcome": outcome,
            },
        )

    async def apply_override(self, req: OverrideRequest) -> dict[str, Any]:
        """Apply an operator override (validated by the API), audit it and tell the policy."""
        entry = await self.overrides.apply(req)
        self.engine.overrides = self.overrides.to_policy()
        if req.action == "reset_storm" and self.fleet is not None:
            self.fleet.reset_storm()
        log.warning(
            "override by %s: %s%s (%s)",
            req.actor,
            req.action,
            f" {req.node} {req.pin.value if req.pin else ''}".rstrip() if req.node else "",
            req.reason,
        )
        self.events.publish("override", entry)
        return entry

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
            except Exception:
                log.exception("%s: adapter error at start, will retry", runner.name)
            finally:
                await runner.adapter.close()

    async def run(self, *, handle_signals: bool = True) -> None:
        """Run until stop() or SIGTERM/SIGINT; SIGHUP reloads the config."""
        loop = asyncio.get_running_loop()
        signals = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
        if handle_signals:
            for sig in signals:
                loop.add_signal_handler(sig, self._on_signal, sig)
        api = web.AppRunner(
            make_app(self), access_log=None, handle_signals=False, shutdown_timeout=STOP_GRACE_S / 2
        )
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
                    self._tg = tg
                    for runner in self.runners:
                        self._start_runner(runner)
                    tg.create_task(
                        self.engine.run(self.config.policy.evaluate_interval_s), name="policy"
                    )
                    tg.create_task(self.deliverer.run(), name="delivery")
                    tg.create_task(self.decisions.run(), name="storage")
                    if self.fleet is not None:
                        tg.create_task(run_fleet(self.fleet, self.leader), name="fleet")
                    if self.reconciler is not None:
                        tg.create_task(self.reconciler.run(), name="reconcile")
                    tg.create_task(self._mark_ready(), name="ready")
                    tg.create_task(self._report_status(), name="status")
                    tg.create_task(self._publish_assessments(), name="assessments")
                    if self.notifier.watchdog_s:
                        tg.create_task(self._watchdog(self.notifier.watchdog_s), name="watchdog")
                    tg.create_task(self._wait_stop(), name="stop")
            except* _Shutdown:
                pass
        finally:
            self._tg = None
            if handle_signals:
                for sig in signals:
                    loop.remove_signal_handler(sig)
            await self._shutdown(api)

    def _start_runner(self, runner: SourceRunner) -> None:
        assert self._tg is not None
        if self.leader is not None and self.leader.owns(runner):
            return  # the rack leader runs it, or reads it from the rack's leader
        self._runner_tasks[runner.name] = self._tg.create_task(
            runner.run(), name=f"source:{runner.name}"
        )

    def _on_signal(self, sig: signal.Signals) -> None:
        if sig is signal.SIGHUP:
            log.info("SIGHUP received, reloading configuration")
            if self._tg is not None:
                self._tg.create_task(self.reload(), name="reload")
            return
        log.info("%s received, stopping", sig.name)
        self.stop()

    async def reload(self) -> bool:
        """Re-read the config file and apply it without losing state or pending decisions.

        Invalid config: logged, the running config stays. Changed or new sources
        get fresh runners; unchanged ones keep polling. The node, API and scheduler
        settings need a restart (logged when they differ).
        """
        if self.config_path is None:
            log.warning("reload requested but the daemon was not started from a file")
            return False
        async with self._reload_lock:  # SIGHUPs in quick succession apply one at a time
            return await self._reload(self.config_path)

    async def _reload(self, path: Path) -> bool:
        self.notifier.reloading()
        try:
            new = load_config(path)
        except ConfigError as err:
            log.error(
                "reload of %s refused, keeping the running config:\n  %s",
                path,
                "\n  ".join(err.problems),
            )
            self.notifier.ready(self._status_line())
            return False
        old = self.config
        for what, a, b in (
            ("[node]", old.node, new.node),
            ("[api]", old.api, new.api),
            ("[scheduler]", old.scheduler, new.scheduler),
            ("[cluster]", old.cluster, new.cluster),
        ):
            if a != b:
                log.warning("reload: %s changed; it takes effect at the next restart", what)
        for key in ("evaluate_interval_s", "record_trace", "record_max_mb"):
            if getattr(old.policy, key) != getattr(new.policy, key):
                log.warning("reload: policy.%s changed; it takes effect at the next restart", key)
        new = Config(
            old.node, new.sources, new.logging, old.api, new.policy, old.scheduler, old.cluster
        )
        setup_logging(new.logging.level, new.logging.format)
        self.engine.settings = policy_settings(new.policy)
        if old.policy.dry_run != new.policy.dry_run:
            # A dry-run "drain" moved the policy's state without sending anything:
            # start again from what the scheduler was really asked for.
            self._restore_from_outbox()
        await self._reload_sources(old, new)
        self.config = new
        log.info("configuration reloaded from %s", path)
        self.notifier.ready(self._status_line())
        return True

    async def _reload_sources(self, old: Config, new: Config) -> None:
        changed = {
            name
            for name in set(old.sources) | set(new.sources)
            if old.sources.get(name) != new.sources.get(name)
        }
        for runner in [r for r in self.runners if r.name in changed]:
            task = self._runner_tasks.pop(runner.name, None)
            if task is not None:
                task.cancel()
                # wait() rather than await: a cancellation of this reload itself
                # (shutdown) must propagate, not be swallowed with the runner's.
                await asyncio.wait([task])
            runner.first_attempt.set()  # readiness no longer waits on a replaced runner
            self.runners.remove(runner)
            if runner.name in new.sources:
                self.store.replace_on_next_update(runner.name)
            else:
                self.store.drop_source(runner.name)  # removed: its series would only go stale
            log.info("%s: source stopped for reload", runner.name)
        self.config = new  # the new runners read their timing from it
        for name in sorted(changed & set(new.sources)):
            try:
                runner = self._runner(build_adapter(name, new.sources[name]))
            except SourceError as err:
                log.error("%s: cannot start after reload: %s", name, err)
                continue
            self.runners.append(runner)
            if self._tg is not None:
                self._start_runner(runner)
            log.info("%s: source (re)started by reload", name)

    async def _wait_stop(self) -> None:
        await self._stop.wait()
        raise _Shutdown

    async def _mark_ready(self) -> None:
        await asyncio.gather(*(r.first_attempt.wait() for r in self.runners))
        self.ready.set()
        status = self._status_line()
        log.info("%s: ready: %s", self.config.node.name, status)
        self.notifier.ready(status)

    def _status_line(self) -> str:
        outcome = self.engine.last
        cond = outcome.node.condition.value if outcome else "starting"
        sources = ", ".join(f"{r.name} {r.health}" for r in self.runners)
        pending = len(self.decisions)
        return f"{self.config.node.name}: {cond}; sources: {sources}; undelivered: {pending}"

    async def _report_status(self) -> None:
        await self.ready.wait()
        while True:
            self.notifier.status(self._status_line())
            await asyncio.sleep(STATUS_INTERVAL_S)

    async def _publish_assessments(self) -> None:
        # Assessments go to /v1/events when they change, not every evaluation.
        last: tuple[object, ...] | None = None
        while True:
            outcome = self.engine.last
            if outcome is not None:
                a = outcome.node
                ttt = None if a.time_to_threshold_s is None else round(a.time_to_threshold_s, -1)
                key = (a.condition, a.domain, ttt, a.detail)
                if key != last:
                    last = key
                    self.events.publish("assessment", assessment_to_dict(a))
            await asyncio.sleep(self.config.policy.evaluate_interval_s)

    async def _watchdog(self, watchdog_s: float) -> None:
        # Pinged from the event loop itself: a blocked loop stops the pings and
        # systemd restarts the service.
        while True:
            self.notifier.watchdog()
            await asyncio.sleep(watchdog_s / 2)

    async def _shutdown(self, api: web.AppRunner) -> None:
        self.notifier.stopping()
        self.events.close()  # SSE handlers return, so the API can close at once
        pending = self.decisions.pending()
        if pending:
            log.warning(
                "stopping with %d undelivered decision(s): %s",
                len(pending),
                ", ".join(f"{p.decision.node} {p.decision.action}" for p in pending),
            )
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(STOP_GRACE_S):
                await api.cleanup()
                if self.fleet is not None and self.fleet.etcd is not None:
                    await self.fleet.etcd.close()
                if self.sink is not None:
                    await self.sink.close()
        self.decisions.close()
        if self.recorder is not None:
            self.recorder.close()
        self.notifier.close()
        log.info("%s: stopped", self.config.node.name)
