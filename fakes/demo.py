"""`rackguard-sim demo`: the simulator, the fakes and a fake scheduler, with the real daemon on top.

One rackguard daemon per simulated node (one agent per node, as in production),
each polling its node's GPUs through the real NVML adapter bound to the fake
NVML, and delivering decisions through the real webhook sink to a fake
scheduler on loopback. The simulator runs ``speed`` times faster than real
time, so the daemons' time settings (poll interval, dwell, healthy delay,
staleness) are scaled by the same factor: the policy sees simulated time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import sys
import tempfile
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from adapters.schedulers.webhook.sink import WebhookSink
from adapters.sensors.nvml import NvmlAdapter
from daemon.app import Daemon
from daemon.config import Config, parse_config
from daemon.config.sources import MIN_INTERVAL_S
from fakes.cdu_server import FakeCduServer
from fakes.nvml import FakeNvml
from fakes.scheduler import FakeWebhookScheduler, Received
from fakes.sim import RackSnapshot, Scenario, ScenarioError, SimulatedRack, load_scenario
from fakes.sim.load import LoadWatch, poll_timeout_note, safe_speed
from fakes.snmp_agent import SimulatedPdu
from policies.model import Condition
from policies.power_cap import CapDecision

SIM_POLL_S = 1.0  # each agent polls its GPUs once per simulated second
SIM_STEP_WALL_S = 0.05  # wall seconds between simulator steps
DEMO_SECRET = b"rackguard-demo-webhook-key"
DEMO_WALL_TARGET_S = 60.0  # auto speed: a scenario plays in about a minute


@dataclass(frozen=True, slots=True)
class DemoDecision:
    """A decision as the fake scheduler received it, stamped with simulated time."""

    t: float
    node: str
    action: str
    reason: str
    domain: str


@dataclass
class DemoResult:
    """What happened in one scenario run."""

    scenario: str
    decisions: list[DemoDecision] = field(default_factory=list)
    first_crossing: tuple[float, str, int] | None = None  # (t, node, gpu) at slowdown
    # When NVML first read a GPU at its slowdown temperature: in whole degrees (89.5C
    # reads 90C), so it can be seconds before the crossing, and the agents act on it.
    first_read_at_slowdown: tuple[float, str, int] | None = None
    invalid: str = ""  # why this host could not keep the speed ("" when it did)
    final_state: dict[str, str] = field(default_factory=dict)
    # Per node, each source's health at the end of the run.
    source_health: dict[str, dict[str, str]] = field(default_factory=dict)
    expected_drained: tuple[str, ...] = ()
    # The cap rung (run with caps): (t, node, "gpuN", action, watts) per cap decision.
    caps: list[tuple[float, str, str, str, float]] = field(default_factory=list)

    @property
    def capped_nodes(self) -> set[str]:
        """Nodes with a GPU capped at least once."""
        return {node for _, node, _, action, _ in self.caps if action == "cap"}

    def first_action(self, node: str) -> DemoDecision | None:
        """The first drain or exclusion of a node."""
        return next((d for d in self.decisions if d.node == node and d.action != "resume"), None)

    @property
    def acted_nodes(self) -> set[str]:
        """Nodes drained or excluded at least once."""
        return {d.node for d in self.decisions if d.action != "resume"}

    @property
    def as_expected(self) -> bool:
        """Exactly the expected nodes were acted on, each before any GPU crossed slowdown.

        With caps, a capped node is acted on: its cap held the GPU instead of a drain.
        """
        if self.caps:
            acted = self.acted_nodes | self.capped_nodes
            return acted == set(self.expected_drained) and self.first_crossing is None
        if self.acted_nodes != set(self.expected_drained):
            return False
        if self.first_crossing is None:
            return True
        firsts = [self.first_action(n) for n in self.expected_drained]
        return all(f is not None and f.t <= self.first_crossing[0] for f in firsts)


@dataclass(frozen=True, slots=True)
class RackFakes:
    """Where the rack's fake PDU (SNMP) and CDU (OPC-UA) listen, for the agents' configs."""

    pdu_port: int
    community_file: Path
    probe_positions: dict[str, str]
    cdu_url: str
    cdu_profile: str

    def sources(self) -> str:
        """The [sources.pdu] and [sources.cdu] tables.

        They poll on wall-clock timing like a real node would (inlet air and
        coolant are slow signals); only the GPUs are polled once per simulated second.
        """
        probes = ", ".join(f'"{k}" = "{v}"' for k, v in self.probe_positions.items())
        return f"""
        [sources.pdu]
        type = "snmp"
        host = "127.0.0.1"
        port = {self.pdu_port}
        version = "2c"
        community_file = "{self.community_file}"
        probe_positions = {{ {probes} }}
        interval_s = 0.5
        timeout_s = 0.4
        request_timeout_s = 0.3
        poll_deadline_s = 0.35
        retries = 0
        backoff_initial_s = 0.5
        backoff_max_s = 2.0
        [sources.cdu]
        type = "opcua"
        url = "{self.cdu_url}"
        profile = "{self.cdu_profile}"
        interval_s = 0.5
        timeout_s = 0.45
        sampling_interval_s = 0.25
        keepalive_s = 1.0
        stale_after_s = 3.0
        bad_after_s = 6.0
        request_timeout_s = 1.0
        backoff_initial_s = 0.5
        backoff_max_s = 2.0
        """


def daemon_config(
    node: str,
    rack: str,
    url: str,
    secret: Path,
    speed: float,
    fakes: RackFakes | None = None,
    *,
    caps: bool = False,
) -> Config:
    """A node agent's config with its time settings scaled to simulated time.

    ``caps``: the cap rung on, NVML direct (the demo's fake NVML is privileged).
    """
    power_cap = (
        f"""
        [power_cap]
        enabled = true
        via = "direct"
        settle_s = {120.0 / speed}
        healthy_after_s = {120.0 / speed}
        restore_every_s = {30.0 / speed}
        storm_window_s = {600.0 / speed}
        """
        if caps
        else ""
    )
    # At very high speeds the poll interval stops shrinking at the config's floor.
    interval = max(SIM_POLL_S / speed, MIN_INTERVAL_S)
    rack_sources = fakes.sources() if fakes is not None else ""
    return parse_config(
        f"""
        [node]
        name = "{node}"
        rack = "{rack}"
        [api]
        port = 0
        [sources.gpus]
        type = "nvml"
        interval_s = {interval}
        timeout_s = {interval * 0.8}
        backoff_initial_s = {interval}
        backoff_max_s = {interval * 8}
        {rack_sources}
        [policy]
        min_dwell_s = {60.0 / speed}
        resume_after_s = {120.0 / speed}
        stale_after_s = {5.0 / speed}
        evaluate_interval_s = {interval}
        rack_stale_after_s = {30.0 / speed}
        lead_time_s = {600.0 / speed}
        trend_window_s = {300.0 / speed}
        trend_bucket_s = {10.0 / speed}
        skill_horizon_s = {60.0 / speed}
        load_settle_s = {120.0 / speed}
        max_gpu_rate_c_per_min = {10.0 * speed}
        max_air_rate_c_per_min = {5.0 * speed}
        flow_loss_confirm_s = {5.0 / speed}
        critical_grace_s = {20.0 / speed}
        storm_window_s = {600.0 / speed}
        resume_window_s = {60.0 / speed}
        resume_jitter = 0.05
        [scheduler]
        type = "webhook"
        url = "{url}"
        secret_file = "{secret}"
        retry_initial_s = {interval}
        retry_max_s = {interval * 10}
        outbox_path = "{secret.parent / f"outbox-{node}.sqlite3"}"
        {power_cap}
        """,
        origin=f"demo config for {node}",
    )


class LiveView:
    """Renders the rack, the agents and the decisions to a terminal."""

    def __init__(
        self, out: TextIO, rack: SimulatedRack, daemons: list[Daemon], speed: float, *, live: bool
    ) -> None:
        self.out = out
        self.rack = rack
        self.daemons = daemons
        self.speed = speed
        self.live = live
        self.color = live and os.environ.get("NO_COLOR") is None
        self.history: dict[str, deque[tuple[float, float]]] = {
            n: deque(maxlen=240) for n in rack.scenario.rack.nodes
        }
        self.decisions: list[tuple[DemoDecision, str]] = []
        self.caps: dict[tuple[str, str], tuple[str, float]] = {}  # (node, gpu) -> last
        self._last_conditions: dict[str, Condition] = {}
        self._last_status_t = -1e9

    def _c(self, code: str, text: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.color else text

    def sample(self, snap: RackSnapshot) -> None:
        """Remember each node's hottest GPU for the trend column."""
        for node in snap.nodes:
            temps = [g.temperature_c for g in node.gpus if not g.lost]
            if temps:
                self.history[node.name].append((snap.t, max(temps)))

    def trend(self, node: str) -> float | None:
        """°C per simulated minute of the hottest GPU over the last minute."""
        h = self.history[node]
        recent = [(t, v) for t, v in h if t >= h[-1][0] - 60.0] if h else []
        if len(recent) < 2 or recent[-1][0] - recent[0][0] < 10:
            return None
        (t0, v0), (t1, v1) = recent[0], recent[-1]
        return (v1 - v0) / (t1 - t0) * 60.0

    def on_decision(self, d: DemoDecision, state: str) -> None:
        """Record a delivered decision; in plain mode print it at once."""
        self.decisions.append((d, state))
        if not self.live:
            print(
                f"{fmt_t(d.t)}  {d.node}  {d.action.upper():8} {d.reason}  "
                f"[domain {d.domain}; scheduler: {state}]",
                file=self.out,
                flush=True,
            )

    def on_cap(self, c: CapDecision, reason: str) -> None:
        """A cap decision: kept for the live page; in plain mode printed at once."""
        self.caps[(c.node, c.gpu)] = (c.action.value, c.watts)
        if not self.live:
            print(
                f"{fmt_t(self.rack.t)}  {c.node}  {c.action.value.upper():8} gpu{c.gpu} "
                f"power limit {c.watts:.0f}W  {reason}",
                file=self.out,
                flush=True,
            )

    def events(self) -> None:
        """Plain mode: print condition changes and a periodic status line."""
        t = self.rack.t
        for dmn in self.daemons:
            last = dmn.engine.last
            if last is None:
                continue
            cond = last.node.condition
            if self._last_conditions.get(dmn.config.node.name) != cond:
                self._last_conditions[dmn.config.node.name] = cond
                detail = to_sim_time(last.node.detail, self.speed)
                print(
                    f"{fmt_t(t)}  {dmn.config.node.name}  condition {cond.value}"
                    f"{': ' + detail if detail else ''}",
                    file=self.out,
                    flush=True,
                )
        if t - self._last_status_t >= 120.0:
            self._last_status_t = t
            snap = self.rack.snapshot
            hottest = max((g.temperature_c, n.name, g.index) for n in snap.nodes for g in n.gpus)
            print(
                f"{fmt_t(t)}  status: hottest GPU {hottest[1]}/gpu{hottest[2]} "
                f"{hottest[0]:.1f}C; coolant supply {snap.cdu.supply_c:.1f}C, "
                f"flow {snap.cdu.flow_lpm:.1f} l/min",
                file=self.out,
                flush=True,
            )

    def render(self, scheduler: FakeWebhookScheduler) -> None:
        """Live mode: redraw the whole screen."""
        sc = self.rack.scenario
        snap = self.rack.snapshot
        model = sc.rack.model
        lines = [
            self._c("1", f"rackguard-sim demo - scenario {sc.name}") + f"   t={fmt_t(snap.t)} / "
            f"{fmt_t(sc.duration_s)}  (x{self.speed:g})",
            sc.description.strip().splitlines()[0] if sc.description.strip() else "",
            "",
            f"coolant  supply {snap.cdu.supply_c:5.1f}C  return {snap.cdu.return_c:5.1f}C  "
            f"flow {snap.cdu.flow_lpm:5.1f} l/min  pump {'on' if snap.cdu.pump_running else 'OFF'}"
            f"{'  LEAK' if snap.cdu.leak else ''}",
            "inlet    " + "  ".join(f"{k} {v:4.1f}C" for k, v in snap.inlet_c.items()),
            "",
            f"{'NODE':12}  GPU temperatures C (slowdown {model.slowdown_c}C)"
            f"{'':10}trend/min  AGENT     SCHEDULER",
        ]
        by_name = {d.config.node.name: d for d in self.daemons}
        for node in snap.nodes:
            cells = []
            for g in node.gpus:
                text = (
                    " ---" if g.lost else (" ?? " if g.dropped_out else f"{g.temperature_c:4.0f}")
                )
                margin = model.slowdown_c - g.temperature_c
                if g.lost or margin <= 0:
                    text = self._c("31;1", text)
                elif margin <= 5:
                    text = self._c("33", text)
                cells.append(text)
            trend = self.trend(node.name)
            trend_s = f"{trend:+6.1f}C" if trend is not None else "     -"
            last = by_name[node.name].engine.last
            cond = last.node.condition.value if last else "starting"
            sched = scheduler.node_state.get(node.name, "idle")
            lines.append(f"{node.name:12} {''.join(cells)}   {trend_s}   {cond:9} {sched}")
        lines += ["", "decisions (delivered to the scheduler):"]
        for d, _state in self.decisions[-8:]:
            lines.append(f"  {fmt_t(d.t)}  {d.node}  {d.action.upper():8} {d.reason}")
        if not self.decisions:
            lines.append("  none yet")
        capped = [(k, v) for k, v in sorted(self.caps.items()) if v[0] == "cap"]
        if capped:
            lines += ["", "power caps (rackguard's):"]
            lines += [f"  {n}/gpu{g}  capped to {w:.0f}W" for (n, g), (_, w) in capped]
        self.out.write("\x1b[H\x1b[2J" + "\n".join(lines) + "\n")
        self.out.flush()


_RATE = re.compile(r"([+-]?\d+(?:\.\d+)?)C/min")
_DURATION = re.compile(r"(?<![\w.])(~?)(\d+(?:\.\d+)?)s\b")


def to_sim_time(reason: str, speed: float) -> str:
    """A reason with its rates and durations in simulated time.

    The agents run on the wall clock while the rack runs ``speed`` times faster,
    so they see rates ``speed`` times too steep and durations too short.
    """
    if speed == 1.0:
        return reason

    def rate(m: re.Match[str]) -> str:
        return f"{float(m.group(1)) / speed:+.1f}C/min"

    def duration(m: re.Match[str]) -> str:
        seconds = float(m.group(2)) * speed
        text = f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f}s"
        return m.group(1) + text

    return _DURATION.sub(duration, _RATE.sub(rate, reason))


def fmt_t(t: float) -> str:
    """Simulated seconds as +mm:ss."""
    m, s = divmod(int(t), 60)
    return f"+{m:02d}:{s:02d}"


def playable_speed(asked: float | None, duration_s: float) -> float:
    """The speed to play at: as asked (or ~1 min for the scenario), lowered to what a busy
    host keeps, saying so at once; a faster run would change the answer, not just the wait."""
    speed = max(1.0, duration_s / DEMO_WALL_TARGET_S) if asked is None else asked
    note = poll_timeout_note(speed)
    if note:
        why = " (the scenario in about a minute)" if asked is None else ""
        speed = safe_speed()
        print(
            f"rackguard-sim demo: {note.replace(' gives', f'{why} gives', 1)}:"
            f" playing at x{speed:g} instead, about {duration_s / speed / 60:.0f} min",
            file=sys.stderr,
            flush=True,
        )
    return speed


async def run_scenario(
    scenario: str | Scenario,
    *,
    speed: float | None = None,
    seed: int | None = None,
    live: bool = False,
    out: TextIO | None = None,
    on_tick: Callable[[SimulatedRack], None] | None = None,
    caps: bool = False,
) -> DemoResult:
    """Play one scenario (a shipped name, a file, or a loaded one) to its end; what happened.

    ``caps``: each agent runs the cap rung on its node's fake NVML (privileged).
    """
    out = out or sys.stdout
    rack = SimulatedRack(scenario, seed=seed)
    sc = rack.scenario
    speed = playable_speed(speed, sc.duration_s)
    result = DemoResult(sc.name, expected_drained=sc.expect.drained_nodes)
    scheduler = FakeWebhookScheduler(DEMO_SECRET)
    url = await scheduler.start()
    pdu = SimulatedPdu(lambda: rack.snapshot)
    await pdu.start()
    cdu = FakeCduServer()
    await cdu.start()
    with tempfile.TemporaryDirectory(prefix="rackguard-demo-") as tmp:
        secret = Path(tmp) / "webhook.key"
        secret.write_bytes(DEMO_SECRET)
        community = Path(tmp) / "pdu.community"
        community.write_text("public\n")
        for private in (secret, community):  # secrets readable by others are refused
            private.chmod(0o600)
        fakes = RackFakes(
            pdu.port,
            community,
            dict(pdu.probe_positions),
            cdu.url,
            "opc40082-tcd" if cdu.model == "tcd" else "generic",
        )
        nvmls = {node: FakeNvml(rack.gpus_by_node[node]) for node in sc.rack.nodes}
        for fake in nvmls.values():
            fake.privileged = caps
        daemons = [
            Daemon(
                daemon_config(node, "rack-sim", url, secret, speed, fakes, caps=caps),
                adapters={"gpus": NvmlAdapter("gpus", nvmls[node])},
                sink=WebhookSink(url, DEMO_SECRET),
                nvml=nvmls[node] if caps else None,
            )
            for node in sc.rack.nodes
        ]
        view = LiveView(out, rack, daemons, speed, live=live)
        for dmn in daemons:
            _watch_caps(dmn, rack, view, result, speed)

        def received(item: Received) -> None:
            p = item.payload
            reason = to_sim_time(p["reason"], speed)
            d = DemoDecision(rack.t, p["node"], p["action"], reason, p["domain"])
            result.decisions.append(d)
            view.on_decision(d, scheduler.node_state.get(d.node, "?"))

        scheduler.on_receive = received
        if not live:
            print(
                f"rackguard-sim demo: scenario {sc.name} ({fmt_t(sc.duration_s)} simulated, "
                f"x{speed:g}, {len(daemons)} nodes)",
                file=out,
                flush=True,
            )
        try:
            async with asyncio.TaskGroup() as tg:
                follow = tg.create_task(cdu.follow(lambda: rack.snapshot.cdu, 0.2))
                for d in daemons:
                    tg.create_task(d.run(handle_signals=False))
                watch = LoadWatch(speed, lambda m: print(m, file=sys.stderr, flush=True))
                await _drive(rack, view, scheduler, speed, result, on_tick, watch, daemons)
                result.invalid = watch.invalid
                result.source_health = {
                    d.config.node.name: {r.name: r.health.value for r in d.runners} for d in daemons
                }
                follow.cancel()
                for d in daemons:
                    d.stop()
        finally:
            await scheduler.stop()
            await pdu.stop()
            await cdu.stop()
    result.final_state = dict(scheduler.node_state)
    return result


def _watch_caps(
    dmn: Daemon, rack: SimulatedRack, view: LiveView, result: DemoResult, speed: float
) -> None:
    """Record (and, in plain mode, print) each cap decision the agent hands on."""
    take = dmn.engine.on_caps
    if take is None:
        return

    def seen(decisions: list[CapDecision]) -> None:
        for c in decisions:
            result.caps.append((rack.t, c.node, "gpu" + c.gpu, c.action.value, c.watts))
            view.on_cap(c, to_sim_time(c.reason, speed))
        take(decisions)

    dmn.engine.on_caps = seen


async def _drive(
    rack: SimulatedRack,
    view: LiveView,
    scheduler: FakeWebhookScheduler,
    speed: float,
    result: DemoResult,
    on_tick: Callable[[SimulatedRack], None] | None,
    watch: LoadWatch,
    daemons: list[Daemon],
) -> None:
    loop = asyncio.get_running_loop()
    start = loop.time()
    slowdown = rack.scenario.rack.model.slowdown_c
    last_render = 0.0
    while rack.t < rack.scenario.duration_s:
        # Follow the wall clock so the simulated time matches what the agents see.
        target = (loop.time() - start) * speed
        if target > rack.t:
            snap = rack.advance(min(target, rack.scenario.duration_s) - rack.t)
            view.sample(snap)
            if result.first_crossing is None:
                result.first_crossing = _first_gpu(snap, lambda c: c >= slowdown)
            if result.first_read_at_slowdown is None:
                # As the fake NVML reports it: rounded to whole degrees.
                result.first_read_at_slowdown = _first_gpu(snap, lambda c: round(c) >= slowdown)
            if on_tick is not None:
                on_tick(rack)
        now = loop.time()
        if view.live and now - last_render >= 0.25:
            view.render(scheduler)
            last_render = now
        elif not view.live:
            view.events()
        for d in daemons:
            for r in d.runners:
                if r.name == "gpus" and "timed out" in r.stats.last_error:
                    watch.breach(f"{d.config.node.name}: a GPU poll {r.stats.last_error}")
        watch.before_sleep()
        await asyncio.sleep(SIM_STEP_WALL_S)
        watch.after_sleep(SIM_STEP_WALL_S)
    if view.live:
        view.render(scheduler)


def _first_gpu(snap: RackSnapshot, hot: Callable[[float], bool]) -> tuple[float, str, int] | None:
    """(t, node, gpu) of the first GPU not lost whose temperature is ``hot``, or None."""
    for node in snap.nodes:
        for g in node.gpus:
            if not g.lost and hot(g.temperature_c):
                return (snap.t, node.name, g.index)
    return None


def summary(result: DemoResult) -> str:
    """What was decided and when, against the scenario's ground truth."""
    lines = ["", f"summary of scenario {result.scenario}:"]
    if not result.decisions:
        lines.append("  no decisions: no node was drained")
    for d in result.decisions:
        lines.append(
            f"  {fmt_t(d.t)}  {d.node}  {d.action.upper():8} {d.reason} (domain {d.domain})"
        )
    for at, cnode, cgpu, action, watts in result.caps:
        lines.append(f"  {fmt_t(at)}  {cnode}  {action.upper():8} {cgpu} power limit {watts:.0f}W")
    if result.first_crossing:
        t, node, gpu = result.first_crossing
        lines.append(f"  first GPU at its slowdown temperature: {node}/gpu{gpu} at {fmt_t(t)}")
        read = result.first_read_at_slowdown
        if read is not None and read[0] < t:
            # An exclusion 'at or above slowdown' logged before the crossing is NVML's word.
            lines.append(
                f"  NVML read {read[1]}/gpu{read[2]} at slowdown from {fmt_t(read[0])},"
                f" {t - read[0]:.0f}s before: it reports whole degrees (89.5C reads 90C)"
            )
        for n in result.expected_drained:
            first = result.first_action(n)
            if first is not None:
                lead = t - first.t
                lines.append(
                    f"  {n}: {first.action} {lead:.0f}s before that crossing"
                    if lead >= 0
                    else f"  {n}: {first.action} {-lead:.0f}s too late"
                )
    else:
        lines.append("  no GPU reached its slowdown temperature")
    expected = ", ".join(result.expected_drained) or "none"
    verdict = "as expected" if result.as_expected else "NOT as expected"
    if result.invalid:
        verdict = f"INVALID ({result.invalid}; lower --speed)"
    what = "acted on (capped or drained), none reaching slowdown" if result.caps else "drained"
    lines.append(f"  expected nodes {what}: {expected}; outcome {verdict}")
    lines.append(
        "  final scheduler state: "
        + ", ".join(f"{n}={s}" for n, s in sorted(result.final_state.items()))
        if result.final_state
        else "  final scheduler state: every node idle"
    )
    return "\n".join(lines)


async def run_demo(
    scenario: str = "hot-gpu",
    speed: float | None = None,
    live: bool = True,
    seed: int | None = None,
    caps: bool = True,
) -> int:
    """The `rackguard-sim demo` command; exit 0 when the outcome matches the scenario's truth.

    ``scenario`` is a shipped scenario's name or a scenario file's path; a file
    that cannot be used is refused with exit 2 and one line naming its key.
    """
    live = live and sys.stdout.isatty()
    try:
        load_scenario(scenario)
    except ScenarioError as err:
        print(f"rackguard-sim demo: {err}", file=sys.stderr)
        return 2
    with contextlib.suppress(KeyboardInterrupt):
        result = await run_scenario(scenario, speed=speed, seed=seed, live=live, caps=caps)
        print(summary(result), flush=True)
        return 0 if result.as_expected and not result.invalid else 1
    return 130
