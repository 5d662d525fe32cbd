"""The running service: one TaskGroup over the source runners, policy, delivery and API.

The parts live beside it: the build step (daemon/service/build.py), the atomic
reloader (reloader.py), readiness / status / watchdog (status.py) and the
read-only view the API and the metrics get (view.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import signal
import sqlite3
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from aiohttp import web

from adapters.base import SchedulerSink, SensorAdapter
from adapters.errors import SourceError, SourceSetupError
from adapters.schedulers.backend import Backend
from adapters.schedulers.base import ReadableSink
from adapters.schedulers.kubernetes.client import KubeAuthError
from adapters.timeouts import time_limit
from daemon.config import Config, config_notes, read_secret
from daemon.config.outbox_path import outbox_location
from daemon.config.policy import policy_settings
from daemon.config.sources import SourceTiming
from daemon.delivery.database import OutboxBusy, OutboxRefused
from daemon.delivery.deliverer import Deliverer
from daemon.delivery.notices import JobNotices
from daemon.delivery.outbox import DecisionStore, Row, Status
from daemon.delivery.overrides import AuditEntry, OverrideRequest, OverrideStore
from daemon.delivery.reconcile import Reconciler
from daemon.delivery.sinks import build_backend, build_job_notices
from daemon.http.api import ApiContext, make_app
from daemon.http.cap_ladder_metrics import CapLadderCollector
from daemon.http.charts import ChartHistory
from daemon.http.events import EventHub, delivery_event
from daemon.http.metrics import Metrics
from daemon.http.notice import Notice
from daemon.http.power_cap_metrics import PowerCapCollector
from daemon.http.power_caps import NodePowerCaps
from daemon.http.steering import SteeringCollector
from daemon.http.view import ServiceView
from daemon.loops import run_in
from daemon.replay.recorder import TraceRecorder
from daemon.service.build import build_adapters, first_connect
from daemon.service.cluster import FleetCollector, build_fleet, build_leader, run_fleet
from daemon.service.engine import PolicyEngine
from daemon.service.listener import CappedSite, connection_cap
from daemon.service.notify import Notifier
from daemon.service.power_cap import CapRecord, build_power_caps
from daemon.service.reloader import Reloader
from daemon.service.runner import SourceRunner
from daemon.service.source_set import SourceSet
from daemon.service.state import StateStore
from daemon.service.steering import Steering, build_setting
from daemon.service.throttle import ThrottleClock
from daemon.status import StatusReporter
from policies.model import Action, Decision, FaultDomain, Reading

log = logging.getLogger(__name__)

STOP_GRACE_S = 4.0
# An idle keep-alive connection holds a file descriptor: close it soon.
KEEPALIVE_TIMEOUT_S = 15.0


class StartupError(Exception):
    """The daemon cannot start as configured; the message says why and what to do."""


class _Shutdown(Exception):
    """Raised inside the TaskGroup to unwind every task on a stop request."""


class Daemon:
    """Wires config, adapters, policy, delivery and API together, then runs them.

    ``adapters`` and ``sink`` may be injected (the demo and tests pass adapters
    bound to fakes); so may ``nvml``, a simulated NVML binding every NVML source
    then uses (loudly: a WARNING at start, ``simulated`` in /v1/state and
    /readyz). ``config_path`` is re-read on SIGHUP.
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
        nvml: Any = None,
    ) -> None:
        self.config = config
        self.nvml = nvml
        self._rng = rng or random.Random()
        self.notifier = notifier or Notifier()
        self.store = StateStore()
        self.throttle = ThrottleClock()
        self.history = ChartHistory()
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
        self.sources = SourceSet(self.store)
        try:
            built = build_adapters(config, injected=adapters, nvml=nvml)
        except SourceError as err:
            raise StartupError(str(err)) from err
        # An injected sink stands alone: no job notices, fleet listing or steering.
        self.backend: Backend | None = None
        if sink is None and config.scheduler is not None:
            try:
                self.backend = build_backend(config.scheduler, config.policy.lead_time_s)
            except KubeAuthError as err:
                raise StartupError(f"scheduler: {err}") from err
            sink = self.backend.sink()
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
            undeliverable_after_s=sched.undeliverable_after_s if sched else 120.0,
        )
        notices = build_job_notices(sched, config.policy.lead_time_s, self.backend)
        self.notices = JobNotices(self.decisions, *notices) if notices else None
        self.reconciler: Reconciler | None = None
        if sched is not None and sched.reconcile_interval_s > 0 and isinstance(sink, ReadableSink):
            self.reconciler = Reconciler(
                self.decisions,
                sink,
                interval_s=sched.reconcile_interval_s,
                on_read=self.deliverer.note_read_back,
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
        self.restore_from_outbox(only_out_of_service=True)
        self.deliverer.on_settled = self._on_settled
        self.events = EventHub()
        self.deliverer.on_progress = self._on_progress
        if self.notices is not None:
            self.notices.on_change = lambda n: self.events.publish("notice", Notice.of(n))
        self.overrides = OverrideStore(self.decisions)
        self.engine.overrides = self.overrides.to_policy()
        self.api_token = read_secret(config.api.token_file) if config.api.token_file else None
        self.view = ServiceView(
            config=lambda: self.config,
            runners=lambda: self.sources.runners,
            store=self.store,
            engine=self.engine,
            decisions=self.decisions,
            deliverer=self.deliverer,
            overrides=self.overrides,
            events=self.events,
            simulated=nvml is not None or bool(adapters),
            cluster=lambda: self.fleet.status() if self.fleet is not None else None,
            notices=self.notices,
            throttle=self.throttle,
            history=self.history,
        )
        self.metrics = Metrics(self.view)
        lister = self.backend.lister() if self.backend is not None else None
        self.fleet = build_fleet(config, lister, self.engine, self._rng)
        if self.fleet is not None:
            self.metrics.registry.register(FleetCollector(self.fleet))
        self.leader = build_leader(
            self.fleet, lambda: self.config, lambda: self.runners, self._on_readings
        )
        # The rack leader runs the rack's shared sources (or reads them from the leader).
        leader = self.leader
        if leader is not None:
            self.sources.skip = leader.owns
        self.status = StatusReporter(self.view, self.notifier)
        self.steering = self._build_steering()
        if self.steering is not None:
            self.metrics.registry.register(SteeringCollector(self.steering))
        try:
            self.power_caps = build_power_caps(config, self.engine, self.decisions, nvml=nvml)
        except SourceError as err:
            raise StartupError(f"power_cap: {err}") from err
        if self.power_caps is not None:
            self.power_caps.on_record = self._publish_cap
            if self.fleet is not None:  # the cluster cap budget and cap storm, via etcd
                self.fleet.caps = self.power_caps.ladder
            self.metrics.registry.register(PowerCapCollector(self.power_caps.limiter.latest))
            self.metrics.registry.register(CapLadderCollector(self.power_caps))
        self.sources.runners.extend(
            self.make_runner(adapter, config.sources[name].timing)
            for name, adapter in built.items()
        )
        self.reloader = Reloader(self, config_path)
        self._stop = asyncio.Event()
        self._tg: asyncio.TaskGroup | None = None
        self._reload_pending = False  # SIGHUP before the TaskGroup started
        self.api_port: int | None = None

    def _build_steering(self) -> Steering | None:
        """Steering of this node's Weight or label, where the scheduler has one."""
        built = build_setting(self.backend, self.config.steering)
        node = self.config.node.name
        if built is None:
            if self.config.steering.enabled:
                log.warning("%s: steering is enabled but the scheduler has no node setting", node)
            return None
        setting, value_of = built
        engine = self.engine
        return Steering(
            node,
            setting,
            self.decisions,
            config=lambda: self.config.steering,
            value_of=value_of,
            headroom=lambda: engine.last.headroom if engine.last is not None else None,
            held=lambda: engine.state.action is not Action.RESUME,
            busy=lambda: node in self.decisions.busy_nodes(),
        )

    @property
    def runners(self) -> list[SourceRunner]:
        """The running source runners (changed by reloads)."""
        return self.sources.runners

    @property
    def ready(self) -> asyncio.Event:
        """Set once every source has tried once and the API is up."""
        return self.status.ready

    def restore_from_outbox(self, *, only_out_of_service: bool = False) -> None:
        """Start the policy from what the scheduler was last asked for."""
        intent = self.decisions.intents().get(self.config.node.name)
        action = intent.action if intent is not None else Action.RESUME
        if action is Action.RESUME and only_out_of_service:
            return
        # The domain matters: a node drained for the cooling loop waits for fresh
        # loop evidence before it can be called healthy again.
        domain = intent.domain if intent is not None else FaultDomain.NONE
        self.engine.restore(action, time.monotonic(), domain=domain)

    def make_runner(self, adapter: SensorAdapter, timing: SourceTiming) -> SourceRunner:
        """A runner for one adapter, feeding the state store and the poll metrics."""
        return SourceRunner(
            adapter, timing, self._on_readings, rng=self._rng, on_attempt=self.metrics.observe_poll
        )

    def _on_readings(self, source: str, readings: Sequence[Reading]) -> None:
        self.store.update(source, readings)
        self.throttle.observe(readings)
        self.history.observe(readings)
        if self.leader is not None:
            self.leader.on_readings(source, readings)
        if self.recorder is not None:
            self.recorder.record(source, readings)

    def _on_decision(self, decision: Decision) -> None:
        self.metrics.count_decision(decision)
        self.decisions.submit(decision)  # durable (or held in memory) before it is sent
        self.events.publish("decision", decision)

    def _on_progress(self, row: Row) -> None:
        self.events.publish("delivery", delivery_event(row))

    def _on_settled(self, decision: Decision, status: Status, outcome: str) -> None:
        if self.notices is not None:
            self.notices.settled(decision, status, outcome)  # may open a job notice

    async def apply_override(self, req: OverrideRequest) -> AuditEntry:
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

    async def reload(self) -> bool:
        """Re-read the config file and apply it atomically (see daemon/service/reloader.py)."""
        return await self.reloader.reload()

    async def check_sources(self) -> None:
        """First connect of every source; a setup error (no driver, ...) stops the start.

        Transient failures are left to the runners' backoff.
        """
        for runner in self.runners:
            try:
                await first_connect(runner.adapter, self.config.sources[runner.name])
            except SourceSetupError as err:
                raise StartupError(f"source {runner.name!r}: {err}") from err
            except (SourceError, TimeoutError) as err:
                log.warning("%s: not reachable at start, will retry: %s", runner.name, err)
            except Exception:
                log.exception("%s: adapter error at start, will retry", runner.name)

    def _api_context(self) -> ApiContext:
        api = self.config.api
        return ApiContext(
            view=self.view,
            metrics=self.metrics,
            apply_override=self.apply_override,
            token=self.api_token,
            reads_need_token=api.reads_need_token,
            max_event_streams=api.max_event_streams,
            notices=lambda: (self.config.node.name, self.notices),
            steering=lambda: (
                self.config.node.name,
                self.steering.status() if self.steering is not None else None,
            ),
            power_caps=self._power_caps_view,
        )

    def _publish_cap(self, record: CapRecord) -> None:
        self.events.publish("power_cap", record)

    def _power_caps_view(self) -> NodePowerCaps:
        caps = self.power_caps
        if caps is None:
            return NodePowerCaps(self.config.node.name, False, [], [])
        return NodePowerCaps(self.config.node.name, True, caps.status(), caps.records())

    async def run(self, *, handle_signals: bool = True) -> None:
        """Run until stop() or SIGTERM/SIGINT; SIGHUP reloads the config."""
        loop = asyncio.get_running_loop()
        signals = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
        if self.view.simulated:
            log.warning(
                "%s: SIMULATED GPUs: this process watches no real hardware", self.config.node.name
            )
        for note in config_notes(self.config):
            log.warning("%s: %s", self.config.node.name, note)
        # Signals first: a SIGHUP or SIGTERM during start-up is handled, never fatal.
        if handle_signals:
            for sig in signals:
                loop.add_signal_handler(sig, self._on_signal, sig)
        api = web.AppRunner(
            make_app(self._api_context()),
            access_log=None,
            handle_signals=False,
            shutdown_timeout=STOP_GRACE_S / 2,
            keepalive_timeout=KEEPALIVE_TIMEOUT_S,
        )
        try:
            await api.setup()
            cfg = self.config.api
            site = CappedSite(api, cfg.listen, cfg.port, connection_cap(cfg.max_connections))
            try:
                await site.start()
            except OSError as err:
                raise StartupError(
                    f"api.port: cannot listen on {cfg.listen}:{cfg.port}: {err.strerror or err}"
                ) from err
            self.api_port = api.addresses[0][1]
            log.info("%s: API on http://%s:%d", self.config.node.name, cfg.listen, self.api_port)
            try:
                async with asyncio.TaskGroup() as tg:
                    self._tg = tg
                    self.sources.start(tg)
                    if self._reload_pending:
                        tg.create_task(self.reload(), name="reload")
                    node = self.config.node.name

                    def forever(name: str, loop: Callable[[], Awaitable[None]]) -> None:
                        run_in(tg, name, loop, what=f"{node}: {name} loop")

                    interval = self.config.policy.evaluate_interval_s
                    forever("policy", lambda: self.engine.run(interval))
                    forever("delivery", self.deliverer.run)
                    forever("delivery-watch", self.deliverer.watch)
                    forever("storage", self.decisions.run)
                    if self.fleet is not None:
                        fleet, leader = self.fleet, self.leader
                        forever("fleet", lambda: run_fleet(fleet, leader))
                    if self.reconciler is not None:
                        forever("reconcile", self.reconciler.run)
                    tg.create_task(self.status.mark_ready(lambda: self.runners), name="ready")
                    forever("status", self.status.report)
                    if self.notices is not None:
                        forever("job-notices", self.notices.run)
                    forever("assessments", self._publish_assessments)
                    if self.steering is not None:
                        forever("steering", self.steering.run)
                    if self.power_caps is not None:
                        await self.power_caps.load()
                        caps = self.power_caps
                        forever("power-cap", lambda: caps.run(interval))
                    if self.notifier.watchdog_s:
                        watchdog_s = self.notifier.watchdog_s
                        forever("watchdog", lambda: self.status.watchdog(watchdog_s))
                    tg.create_task(self._wait_stop(), name="stop")
            except* _Shutdown:
                pass
        finally:
            self._tg = None
            self.sources.detach()
            if handle_signals:
                for sig in signals:
                    loop.remove_signal_handler(sig)
            await self._shutdown(api)

    def _on_signal(self, sig: signal.Signals) -> None:
        if sig is signal.SIGHUP:
            log.info("SIGHUP received, reloading configuration")
            if self._tg is not None:
                self._tg.create_task(self.reload(), name="reload")
            else:  # still starting: the file is read again once running
                self._reload_pending = True
            return
        log.info("%s received, stopping", sig.name)
        self.stop()

    async def _wait_stop(self) -> None:
        await self._stop.wait()
        raise _Shutdown

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
                    self.events.publish("assessment", a)
            await asyncio.sleep(self.config.policy.evaluate_interval_s)

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
            async with time_limit(STOP_GRACE_S):
                await api.cleanup()
                if self.fleet is not None and self.fleet.etcd is not None:
                    await self.fleet.etcd.close()
                if self.sink is not None:
                    await self.sink.close()
                if self.notices is not None:
                    await self.notices.close()
        self.decisions.close()
        if self.recorder is not None:
            self.recorder.close()
        self.notifier.close()
        log.info("%s: stopped", self.config.node.name)
