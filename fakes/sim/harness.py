"""`rackguard-sim serve`: one simulated rack on real protocols, driven by one simulator clock.

The simulator runs ``speed`` simulated seconds per wall second. After every
step the harness publishes the rack: each node's GPUs to a shared file
(fakes/sim/served_gpus.py) that a daemon started by ``rackguard-sim node``
reads as its NVML, the PDU as an SNMP v2c/v3 agent laid out in a chosen vendor's MIB, the
CDU as an OPC-UA server (generic or OPC 40082-1 TCD). Faults (fakes/sim/faults.py)
are applied on demand through :meth:`Harness.apply`; what happened — every
fault with its simulated time, the first GPU at its slowdown temperature — is
kept in ``STATE_DIR/run.json`` for ``rackguard-sim score``.

With a scheduler address (``--scheduler``) it also runs the staging scheduler:
the fake webhook receiver (fakes/scheduler.py), checking signatures with the
daemon's key. Every decision it applies is recorded in the run record with its
simulated time, so ``score`` judges what the scheduler applied, not what the
daemon meant to do. ``scheduler_down`` / ``scheduler_up`` stop and start it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import orjson

from daemon.service.throttle import THROTTLE_MASK
from fakes.cdu_server import DEFAULT_NODESET_DIR, FakeCduServer, nodesets_available
from fakes.scheduler import FakeWebhookScheduler, Received
from fakes.sim.faults import FaultError, FaultSpec, Target, parse_fault
from fakes.sim.load import LoadWatch
from fakes.sim.nvml_bridge import SimulatedRack
from fakes.sim.pdu_layouts import LAYOUTS
from fakes.sim.scenario import Scenario, ScenarioError
from fakes.sim.scoring import LOAD_EVENTS
from fakes.sim.served_gpus import encode_node, node_file, write_atomic
from fakes.sim.snmp_engine_agent import EngineAgent, Mode, V3User

log = logging.getLogger(__name__)

STEP_WALL_S = 0.1  # wall seconds between simulator steps
CDU_PUBLISH_S = 0.25
RUN_FORMAT = "rackguard-sim-run"
PDU_MODES: dict[str, Mode] = {
    "pdu_slow": "slow",
    "pdu_garbage": "garbage",
    "pdu_silent": "no_answer",
}


@dataclass(frozen=True, slots=True)
class ServeOptions:
    """Where and how `serve` exposes the rack."""

    state_dir: Path
    speed: float = 1.0
    seed: int | None = None
    pdu_host: str = "127.0.0.1"
    pdu_port: int = 1161
    pdu_profile: str = "apc-rpdu2"
    community: str = "public"
    v3_users: tuple[V3User, ...] = ()
    cdu_host: str = "127.0.0.1"
    cdu_port: int = 4840
    cdu_model: Literal["generic", "tcd"] = "generic"
    nodeset_dir: Path | None = None
    # The staging scheduler: the webhook receiver's address and the key it checks
    # signatures with (the daemon's secret_file, stripped as the daemon reads it).
    scheduler_host: str | None = None
    scheduler_port: int = 0
    webhook_secret: bytes = b""


class Harness:
    """The running rack: the simulator, its published state and the fake devices."""

    def __init__(self, scenario: Scenario, options: ServeOptions) -> None:
        if options.pdu_profile not in LAYOUTS:
            raise ValueError(
                f"pdu profile {options.pdu_profile!r} is not simulated "
                f"(simulated: {', '.join(LAYOUTS)})"
            )
        if options.speed <= 0:
            raise ValueError(f"speed must be positive, got {options.speed:g}")
        self.scenario = scenario
        self.options = options
        self.rack = SimulatedRack(scenario, seed=options.seed)
        self.layout = LAYOUTS[options.pdu_profile]
        self.pdu = EngineAgent(
            lambda: self.layout.values(self.rack.snapshot),
            host=options.pdu_host,
            port=options.pdu_port,
            community=options.community,
            users=options.v3_users,
        )
        nodeset_dir = options.nodeset_dir or DEFAULT_NODESET_DIR
        if options.cdu_model == "tcd" and not nodesets_available(nodeset_dir):
            raise ValueError(
                "cdu model 'tcd' needs the OPC 40082-1 nodesets (--nodeset-dir DIR with "
                "Opc.Ua.Di, PlasticsRubber.GeneralTypes 1.03 and TCD NodeSet2 files)"
            )
        self.cdu = FakeCduServer(
            host=options.cdu_host,
            port=options.cdu_port,
            model=options.cdu_model,
            nodeset_dir=nodeset_dir,
        )
        self.scheduler: FakeWebhookScheduler | None = None
        if options.scheduler_host is not None:
            self.scheduler = FakeWebhookScheduler(options.webhook_secret, on_receive=self._applied)
        self.scheduler_up = False
        self._scheduler_port = options.scheduler_port
        self.applied: list[dict[str, Any]] = []
        # GPU-seconds throttled (heat or power brake) on nodes the scheduler has not
        # taken out of service (all nodes when serve runs no scheduler).
        self.throttled_s = 0.0
        self.load = LoadWatch(options.speed, self._invalid)
        self.stuck: dict[tuple[str, int], float] = {}
        self.history: list[dict[str, Any]] = []
        self.first_crossing: dict[str, Any] | None = None
        self.wall_start = 0.0
        self._mono_start = 0.0
        self._tasks: set[asyncio.Task[None]] = set()
        self._publish_failing = False

    # --- clock ------------------------------------------------------------------------

    @property
    def t(self) -> float:
        """Simulated seconds since the start."""
        return self.rack.t

    def _target_t(self) -> float:
        return (time.monotonic() - self._mono_start) * self.options.speed

    # --- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        """Publish the first state, then open the PDU and CDU endpoints."""
        (self.options.state_dir / "gpus").mkdir(parents=True, exist_ok=True)
        self.wall_start = time.time()
        self._mono_start = time.monotonic()
        self._publish_gpus()
        await self.pdu.start()
        await self.cdu.start()
        await self.cdu.publish(self.rack.snapshot.cdu)
        # The CDU server follows the snapshot on its own (and so the simulator's CDU events).
        follow = asyncio.get_running_loop().create_task(
            self.cdu.follow(lambda: self.rack.snapshot.cdu, CDU_PUBLISH_S)
        )
        self._tasks.add(follow)
        await self._scheduler_listen()
        self._write_run()

    async def _scheduler_listen(self) -> None:
        if self.scheduler is None or self.scheduler_up:
            return
        host = self.options.scheduler_host or "127.0.0.1"
        await self.scheduler.start(host, self._scheduler_port)
        # Back on the same port after scheduler_down, even when the first one was chosen free.
        self._scheduler_port = int(self.scheduler.url.rsplit(":", 1)[1].split("/", 1)[0])
        self.scheduler_up = True

    async def _scheduler_stop(self) -> None:
        if self.scheduler is not None and self.scheduler_up:
            await self.scheduler.stop()
            self.scheduler_up = False

    def _applied(self, item: Received) -> None:
        node, action = str(item.payload.get("node")), str(item.payload.get("action"))
        self.applied.append(
            {"t": round(self.rack.t, 3), "wall": time.time(), "node": node, "action": action}
        )
        log.info("scheduler: applied %s %s at t=%.0fs", node, action, self.rack.t)
        self._write_run()

    async def run(self) -> None:
        """Step the simulator on the wall clock until cancelled."""
        while True:
            target = self._target_t()
            if target > self.rack.t:
                self._count_throttled(target - self.rack.t)
                self.rack.advance(target - self.rack.t)
                self._check_crossing()
                self._publish_gpus_logged()
            self.load.before_sleep()
            await asyncio.sleep(STEP_WALL_S)
            self.load.after_sleep(STEP_WALL_S)

    def _invalid(self, message: str) -> None:
        log.warning("%s", message)
        self._write_run()

    def _count_throttled(self, dt: float) -> None:
        """Charge ``dt`` to every GPU throttled now on a node still in service."""
        out: set[str] = set()
        for a in self.applied:
            (out.discard if a["action"] == "resume" else out.add)(a["node"])
        for node in self.rack.snapshot.nodes:
            if node.name not in out:
                self.throttled_s += dt * sum(
                    1 for g in node.gpus if g.clock_event_reasons & THROTTLE_MASK
                )

    async def stop(self) -> None:
        """Close every endpoint (the state files stay for scoring)."""
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.pdu.stop()
        await self.cdu.stop()
        await self._scheduler_stop()
        self._write_run()

    # --- publishing -------------------------------------------------------------------

    def _publish_gpus_logged(self) -> None:
        """Publish, logging a failure once (a full disk) and the recovery; the rack runs on."""
        try:
            self._publish_gpus()
        except OSError as err:
            if not self._publish_failing:
                log.warning("cannot write the GPU files in %s: %s", self.options.state_dir, err)
            self._publish_failing = True
            return
        if self._publish_failing:
            log.info("GPU files in %s written again", self.options.state_dir)
            self._publish_failing = False

    def _publish_gpus(self) -> None:
        for node, gpus in self.rack.gpus_by_node.items():
            for index, gpu in enumerate(gpus):
                frozen = self.stuck.get((node, index))
                if frozen is not None:
                    gpu.temperature_c = frozen
            write_atomic(
                node_file(self.options.state_dir, node),
                encode_node(node, self.scenario.rack.gpu_model, gpus),
            )

    def _check_crossing(self) -> None:
        if self.first_crossing is not None:
            return
        slowdown = self.scenario.rack.model.slowdown_c
        for node in self.rack.snapshot.nodes:
            for g in node.gpus:
                if not g.lost and not g.dropped_out and g.temperature_c >= slowdown:
                    self.first_crossing = {"t": self.rack.t, "node": node.name, "gpu": g.index}
                    log.info(
                        "%s gpu%d at its slowdown temperature at t=%.0fs",
                        node.name,
                        g.index,
                        self.rack.t,
                    )
                    self._write_run()
                    return

    def endpoints(self) -> dict[str, Any]:
        """Where each device listens, and the probe labels the PDU reports."""
        return {
            "pdu": {
                "host": self.options.pdu_host,
                "port": self.pdu.port,
                "profile": self.layout.profile,
                "probe_positions": self.layout.probe_positions(self.rack.snapshot),
            },
            "cdu": {
                "url": self.cdu.url,
                "profile": "opc40082-tcd" if self.cdu.model == "tcd" else "generic",
            },
            "gpus": {
                n: str(node_file(self.options.state_dir, n)) for n in self.scenario.rack.nodes
            },
        }

    def run_record(self) -> dict[str, Any]:
        """What `score` needs: the clock, the faults applied and the first crossing."""
        return {
            "format": RUN_FORMAT,
            "scenario": self.scenario.name,
            "scenario_file": self.scenario.source,
            "speed": self.options.speed,
            "wall_start": self.wall_start,
            "t": self.rack.t,
            "faults": [*self._timeline_faults(), *self.history],
            "first_crossing": self.first_crossing,
            "endpoints": self.endpoints(),
            # null: serve ran without a scheduler, so nothing records what was applied.
            "scheduler": None
            if self.scheduler is None
            else {
                "url": f"http://{self.options.scheduler_host}:{self._scheduler_port}/rackguard",
                "up": self.scheduler_up,
                "rejected_signatures": self.scheduler.rejected_signatures,
            },
            "applied": list(self.applied),
            "throttled_gpu_seconds_in_service": round(self.throttled_s, 3),
            # Why this host could not keep the speed (the result is not valid), or null.
            "invalid": self.load.invalid or None,
        }

    def _timeline_faults(self) -> list[dict[str, Any]]:
        """The scenario's own faults (not job starts, stops or power caps) played so far."""
        return [
            {
                "t": e.at_s,
                "wall": self.wall_start + e.at_s / self.options.speed,
                "fault": e.kind.value,
                "target": "simulator",
                "source": "timeline",
                "params": {
                    "target": e.target,
                    **({"gpu": e.gpu} if e.gpu is not None else {}),
                    **dict(e.params),
                },
            }
            for e in self.scenario.events
            if e.kind not in LOAD_EVENTS and e.at_s <= self.rack.t
        ]

    def _write_run(self) -> None:
        path = self.options.state_dir / "run.json"
        try:
            write_atomic(path, orjson.dumps(self.run_record(), option=orjson.OPT_INDENT_2))
        except OSError as err:  # a full disk: the run goes on, `score` will lack this record
            log.warning("cannot write the run record %s: %s", path, err)

    def status(self) -> dict[str, Any]:
        """The run record plus what the rack looks like now."""
        snap = self.rack.snapshot
        return {
            **self.run_record(),
            "pdu_mode": self.pdu.mode,
            "stuck_sensors": [f"{n}/gpu{g}" for n, g in self.stuck],
            "rack": {
                "coolant_supply_c": round(snap.cdu.supply_c, 2),
                "flow_lpm": round(snap.cdu.flow_lpm, 2),
                "pump_running": snap.cdu.pump_running,
                "inlet_c": {k: round(v, 2) for k, v in snap.inlet_c.items()},
                "hottest_gpu_c": round(
                    max((g.temperature_c for n in snap.nodes for g in n.gpus), default=0.0), 2
                ),
                "events_active": list(snap.events_active),
            },
        }

    # --- faults -----------------------------------------------------------------------

    def apply(self, name: str, given: dict[str, Any]) -> dict[str, Any]:
        """Apply one fault now; returns its record (FaultError when it cannot be applied)."""
        spec, params = parse_fault(name, given)
        if spec.target is Target.SIMULATOR:
            self._simulator_fault(spec, params)
        elif spec.target is Target.GPU:
            self._gpu_fault(spec, params)
        elif spec.target is Target.PDU:
            self.pdu.mode = PDU_MODES.get(name, "ok")
            self.pdu.delay_s = float(params.get("delay_s", 0.0))
        elif spec.target is Target.SCHEDULER:
            if self.scheduler is None:
                raise FaultError(f"{name}: serve runs no scheduler (start it with --scheduler)")
            change = self._scheduler_listen() if name == "scheduler_up" else self._scheduler_stop()
            task = asyncio.get_running_loop().create_task(change)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            task = asyncio.get_running_loop().create_task(
                self.cdu.restart(
                    change_node_ids=bool(params["new_node_ids"]),
                    downtime_s=float(params["downtime_s"]),
                )
            )
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        record = {
            "t": round(self.rack.t, 3),
            "wall": time.time(),
            "fault": name,
            "target": spec.target.value,
            "params": params,
        }
        self.history.append(record)
        log.info("fault %s %s at t=%.1fs", name, params, self.rack.t)
        self._write_run()
        return record

    def _simulator_fault(self, spec: FaultSpec, params: dict[str, Any]) -> None:
        assert spec.event is not None
        event_params = {k: v for k, v in params.items() if k not in ("target", "gpu")}
        try:
            self.rack.sim.inject(
                spec.event.value, params.get("target"), gpu=params.get("gpu"), **event_params
            )
        except ScenarioError as err:
            raise FaultError(f"{spec.name}: {str(err).removeprefix('inject: event.')}") from err
        self.rack.advance(0.0)  # a fresh snapshot: the fault shows at once, not at the next step
        self._publish_gpus()

    def _gpu_fault(self, spec: FaultSpec, params: dict[str, Any]) -> None:
        node, index = params["node"], params["gpu"]
        gpus = self.rack.gpus_by_node.get(node)
        if gpus is None:
            nodes = ", ".join(self.rack.gpus_by_node)
            raise FaultError(f"{spec.name}: node: unknown node {node!r} (nodes: {nodes})")
        if index >= len(gpus):
            raise FaultError(f"{spec.name}: gpu: must be below {len(gpus)}, got {index}")
        if spec.name == "sensor_stick":
            self.stuck[(node, index)] = gpus[index].temperature_c
        elif spec.name == "sensor_unstick":
            self.stuck.pop((node, index), None)
        else:
            gpus[index].lost = True
        self._publish_gpus()
