"""The ladder against drain-only, closed loop: the policy's caps act on the simulator.

Per scenario, twice (caps off = today's drain-only policy; caps on), the simulator
stepped 1 s at a time: its readings (GPUs every 1 s, PDU/CDU every 5 s) go to the
policy, the policy evaluates every node, and each cap decision is applied to the
simulated GPU's enforced limit before the next step, as the fake NVML would.

Physics (fakes/sim/thermal.py): one lumped die + cold plate per GPU,
``C dT/dt = P - (T - T_node)/R_eff - (T - T_inlet)/R_air``, ``P = min(demand, limit)``;
a failed pump raises ``R_eff`` (convection ~ flow^-0.8) and lets the coolant warm,
so a GPU heats at a rate ~ P. Throughput under a cap: ``(P/demand)^0.4``
(fakes/sim/throughput.py states where the exponent comes from).

Columns:

* slowdown GPU-seconds: seconds each GPU spent at or above its slowdown temperature;
  "avoided" is drain-only's minus the ladder's.
* capacity given up, GPU-seconds: a GPU of a node out of service (drained or
  excluded) counts 1 per second; a GPU in service counts ``1 - throughput``
  (its cap, or thermal slowdown, slowing its job).
* first slowdown after onset: seconds from the fault's onset to the first GPU
  reading at or above slowdown.
* drain lead: first slowdown minus the last node's first drain or exclusion.
* false caps: GPUs capped in a scenario where no node is expected to be acted on.

Drains do not stop the simulated jobs (a drain lets running work finish), as in
the open-loop scoring (bench/scoring.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from bench.report import Row
from fakes.sim import load_scenario
from fakes.sim.scenario import Scenario, parse_scenario
from fakes.sim.scoring import onset
from fakes.sim.thermal import RackSimulator
from fakes.sim.trace_writer import RACK_NAME, WALL_EPOCH, gpu_readings, rack_readings
from policies.model import Action, Reading, SensorKind
from policies.policy import Policy
from policies.power_cap import CapAction, CapDecision, CapLadder, CapSettings, CapState
from policies.replay import Replayer
from policies.safety import ClusterLedger
from policies.settings import PolicySettings, RackLimits
from policies.trace import Header


@dataclass
class LadderRun:
    """One closed-loop run."""

    name: str
    caps: bool
    slowdown_gpu_s: float = 0.0
    given_up_gpu_s: float = 0.0
    first_slowdown_s: float | None = None
    onset_s: float | None = None
    first_out: dict[str, float] = field(default_factory=dict)  # node -> first drain/exclude
    capped_gpus: set[str] = field(default_factory=set)
    log: list[tuple[float, str]] = field(default_factory=list)  # the ladder, in time

    @property
    def to_slowdown_s(self) -> float | None:
        """Onset to the first slowdown (None: no GPU reached it)."""
        if self.first_slowdown_s is None or self.onset_s is None:
            return None
        return self.first_slowdown_s - self.onset_s

    def drain_lead_s(self, nodes: list[str]) -> float | None:
        """First slowdown minus the last of ``nodes`` to be taken out (None: one never was)."""
        if self.first_slowdown_s is None or any(n not in self.first_out for n in nodes):
            return None
        return self.first_slowdown_s - max(self.first_out[n] for n in nodes)


@dataclass(frozen=True)
class Hooks:
    """What a test does to a closed-loop run: the readings the policy gets, whether a cap
    decision reaches the GPU (False: refused, e.g. NVML_ERROR_NO_PERMISSION, and forgotten
    by the ladder as the daemon's applier does), another actor's moves before each step."""

    readings: Callable[[float, list[Reading]], list[Reading]] | None = None
    apply: Callable[[float, CapDecision], bool] | None = None
    step: Callable[[float, RackSimulator], None] | None = None


def _policy(
    sc: Scenario, settings: PolicySettings, caps: bool, cap_settings: CapSettings | None = None
) -> Policy:
    policy = Policy(settings, {RACK_NAME: sc.rack.nodes})
    model = sc.rack.model
    if caps:
        ladder = CapLadder(cap_settings or CapSettings())
        for node in sc.rack.nodes:
            for i in range(sc.rack.gpus_per_node):
                ladder.observe_limit(node, str(i), model.min_power_limit_w, model.power_limit_w)
        policy.caps = ladder
    return policy


def run_ladder(
    scenario: Scenario | str,
    settings: PolicySettings,
    *,
    caps: bool,
    restart_at: float | None = None,
    carry: Callable[[Policy], list[CapState]] | None = None,
    cap_settings: CapSettings | None = None,
    hooks: Hooks | None = None,
) -> LadderRun:
    """Run a scenario closed loop, with or without the cap rung.

    ``restart_at``: the policy is built afresh then (a daemon restart), given each
    node's state back and the caps ``carry`` returns (the decision store's rows;
    default: none, a restart that forgot them).
    """
    sc = load_scenario(scenario) if isinstance(scenario, str) else scenario
    sim = RackSimulator(sc)
    racks = {RACK_NAME: sc.rack.nodes}
    policy = _policy(sc, settings, caps, cap_settings)
    hooks = hooks or Hooks()
    model = sc.rack.model
    ledger = ClusterLedger(racks, max(settings.storm_window_s, settings.resume_window_s))
    run = LadderRun(sc.name, caps, onset_s=onset(sc))
    steps = int(sc.duration_s)
    for k in range(steps + 1):
        t = float(k)
        if restart_at is not None and t == restart_at:
            kept = carry(policy) if carry is not None else []
            states = policy.states
            policy = _policy(sc, settings, caps, cap_settings)
            for node, st in states.items():
                policy.restore(node, st.action, t, st.domain)
            if policy.caps is not None:
                for cs in kept:
                    policy.caps.restore(replace(cs, since=t, last_step=t))
        if hooks.step is not None:
            hooks.step(t, sim)
        sim.run_until(t)
        snap = sim.snapshot()
        readings: list[Reading] = gpu_readings(snap, sc, WALL_EPOCH)
        if k % 5 == 0:
            readings += rack_readings(snap, RACK_NAME, WALL_EPOCH, sc.rack.empty_probe_slots)
        if hooks.readings is not None:
            readings = hooks.readings(t, readings)
        policy.observe(readings)
        outcomes = policy.evaluate(t, WALL_EPOCH + t, ledger.view(t))
        for c in policy.cap_decisions:
            run.log.append((t, f"{c.node} gpu{c.gpu}: {c.action.value} {c.watts:.0f}W"))
            if c.action is CapAction.CAP:
                run.capped_gpus.add(f"{c.node}/gpu{c.gpu}")
            if c.action is CapAction.RELEASE or c.dry_run:
                continue  # nothing to set (dry_run: the decision is only recorded)
            if hooks.apply is not None and not hooks.apply(t, c):
                if policy.caps is not None:
                    policy.caps.refused(c.node, c.gpu, t)
                continue
            sim.inject("power_cap", c.node, gpu=int(c.gpu), limit_w=c.watts)
        for node, o in outcomes.items():
            d = o.decision
            if d is not None:
                ledger.record(d, t, critical=o.critical, following=o.following)
                run.log.append((t, f"{node}: {d.action.value} ({d.reason})"))
                if d.action is not Action.RESUME:
                    run.first_out.setdefault(node, t)
        for ns in snap.nodes:
            out = policy.states[ns.name].action is not Action.RESUME
            for g in ns.gpus:
                if g.temperature_c >= model.slowdown_c and not g.lost:
                    run.slowdown_gpu_s += 1.0
                    if run.first_slowdown_s is None:
                        run.first_slowdown_s = t
                run.given_up_gpu_s += 1.0 if out else 1.0 - g.throughput
    return run


# No GPU at slowdown; less given up than drain-only. A plate failing on one GPU, a slow
# facility rise that brings GPUs near slowdown before the facility's own limit, and a
# room warming past the A1 allowable at a site rated A2 with derating (crac-slow: both
# runs with SITE_DERATE_LIMIT_C; drain-only cannot derate, so it drains at A1).
HOLD_EVENTS = ("hot-gpu", "supply-drift-warm-water", "crac-slow")
LOOP_EVENTS = ("pump-failure",)  # flow loss to first slowdown >= STRETCH x drain-only's
STRETCH = 2.5
QUIET = ("normal-load", "sensor-dropout", "pump-blip")  # 0 caps (noise, glitch, blip, jobs)
REAL_MIN_W = 150.0  # lowest settable limit of the real traces' boards (A100 PCIe, V100 SXM2)


def real_trace_caps(header: Header, readings: list[Reading], settings: PolicySettings) -> int:
    """Cap decisions over a real trace with the ladder on (none expected)."""
    rp = Replayer(header, settings)
    ladder = CapLadder(CapSettings())
    for r in readings:
        if r.kind is SensorKind.GPU_POWER_LIMIT and r.value is not None:
            node, gpu = r.labels.get("node", ""), r.labels.get("gpu", "")
            ladder.observe_limit(node, gpu, REAL_MIN_W, r.value)
    rp.policy.caps = ladder
    caps = 0
    for _ in rp.feed_all(readings):
        caps += sum(c.action is CapAction.CAP for c in rp.policy.cap_decisions)
    for _ in rp.finish():
        caps += sum(c.action is CapAction.CAP for c in rp.policy.cap_decisions)
    return caps


WARM_WATER_SUPPLY_LIMIT_C = 60.0  # an ASHRAE W+ loop: the site allows supply above 45 C


def supply_drift_warm_water() -> tuple[Scenario, PolicySettings]:
    """A warm-water loop (supply 40 C, limit 60 C) whose heat rejection degrades: the supply
    drifts up 0.5 C/min to +16 C. The GPUs (R*P ~ 36 C at 95 %) reach slowdown at ~54 C
    supply, before the loop's limit: what a cap answers; the limit forecast still drains
    (no shipped scenario has the GPUs bind before the facility limit)."""
    sc = parse_scenario(
        {
            "name": "supply-drift-warm-water",
            "description": "A warm-water loop's supply drifts 0.5 C/min toward its 60 C limit.",
            "duration_s": 3000,
            "seed": 11,
            "rack": {
                "nodes": ["gpu-node-01", "gpu-node-02", "gpu-node-03", "gpu-node-04"],
                "probes": ["bottom", "middle", "top"],
            },
            "facility": {"supply_setpoint_c": 40.0},
            "events": [
                {"at_s": 0, "kind": "job_start", "target": "rack", "util": 0.95},
                {
                    "at_s": 120,
                    "kind": "chiller_fail",
                    "target": "cdu",
                    "rate_c_per_min": 0.5,
                    "max_rise_c": 16,
                },
            ],
            "expect": {
                "drained_nodes": ["gpu-node-01", "gpu-node-02", "gpu-node-03", "gpu-node-04"]
            },
        }
    )
    return sc, warm_water(PolicySettings())


def warm_water(settings: PolicySettings) -> PolicySettings:
    """``settings`` with the warm-water loop's supply limit for the simulator's rack."""
    limits = RackLimits(supply_limit_c=WARM_WATER_SUPPLY_LIMIT_C)
    return replace(settings, racks={**settings.racks, RACK_NAME: limits})


# crac-slow's site: rated ASHRAE A2 (35 C) with derating, A1 (32 C) without.
SITE_DERATE_LIMIT_C = 35.0


def ladder_scenario(name: str, settings: PolicySettings) -> tuple[Scenario, PolicySettings]:
    if name == "supply-drift-warm-water":
        sc, _ = supply_drift_warm_water()
        return sc, warm_water(settings)
    if name == "crac-slow":
        return load_scenario(name), replace(settings, inlet_derate_limit_c=SITE_DERATE_LIMIT_C)
    return load_scenario(name), settings


def synchronized_job_start() -> Scenario:
    """Every GPU of the rack from idle to full load at once: heating fast, but not at flat
    power (no shipped scenario has a whole rack start together)."""
    return parse_scenario(
        {
            "name": "synchronized-job-start",
            "description": "Every GPU of the rack goes from idle to full load at once.",
            "duration_s": 600,
            "seed": 3,
            "rack": {"nodes": ["gpu-node-01", "gpu-node-02", "gpu-node-03", "gpu-node-04"]},
            "events": [{"at_s": 120, "kind": "job_start", "target": "rack", "util": 1.0}],
            "expect": {"drained_nodes": []},
        }
    )


def ladder_rows(settings: PolicySettings) -> list[Row]:
    """The ladder against drain-only on the simulator's scenarios, as rows with targets."""
    rows: list[Row] = []
    names = HOLD_EVENTS + LOOP_EVENTS + ("pump-failure-cdu-silent",) + QUIET
    for name in names:
        sc, s = ladder_scenario(name, settings)
        base = run_ladder(sc, s, caps=False)
        cap = run_ladder(sc, s, caps=True)
        avoided = base.slowdown_gpu_s - cap.slowdown_gpu_s
        rows.append(Row(f"{name}: slowdown GPU-s avoided by caps", avoided, "GPU-s"))
        ok: bool | None = None
        target = ""
        if name in HOLD_EVENTS:
            ok, target = cap.given_up_gpu_s < base.given_up_gpu_s, "< drain-only"
        site = " (site rated A2 with derating)" if name == "crac-slow" else ""
        rows.append(
            Row(
                f"{name}: capacity given up with caps{site}",
                cap.given_up_gpu_s,
                "GPU-s",
                "drain-only",
                base.given_up_gpu_s,
                target,
                ok,
            )
        )
        if name in HOLD_EVENTS:
            label = f"{name}: slowdown GPU-s with caps"
            rows.append(
                Row(label, cap.slowdown_gpu_s, "GPU-s", target="0", ok=not cap.slowdown_gpu_s)
            )
        if name in LOOP_EVENTS or name == "pump-failure-cdu-silent":
            end = float(sc.duration_s) - (cap.onset_s or 0.0)
            stretched = cap.to_slowdown_s if cap.to_slowdown_s is not None else end
            was = base.to_slowdown_s
            ok_s = was is not None and stretched >= STRETCH * was
            # None with caps: no slowdown within the run; the run's end is a lower bound.
            rows.append(
                Row(
                    f"{name}: onset to first slowdown with caps (>= when none in the run)",
                    stretched,
                    "s",
                    "drain-only",
                    was,
                    f">= {STRETCH}x",
                    ok_s,
                )
            )
            nodes = list(sc.expect.drained_nodes)
            lead = cap.drain_lead_s(nodes)
            if cap.first_slowdown_s is None and all(n in cap.first_out for n in nodes):
                lead = float(sc.duration_s) - max(cap.first_out[n] for n in nodes)
            rows.append(
                Row(
                    f"{name}: every node drained before first slowdown, with caps",
                    lead if lead is not None else math.nan,
                    "s",
                    target=">= 20 s",
                    ok=lead is not None and lead >= 20.0,
                )
            )
        if name in QUIET:
            caps = len(cap.capped_gpus)
            rows.append(Row(f"{name}: false caps", caps, "GPUs", target="0", ok=caps == 0))
    sync = run_ladder(synchronized_job_start(), settings, caps=True)
    caps = len(sync.capped_gpus)
    rows.append(Row("synchronized-job-start: false caps", caps, "GPUs", target="0", ok=caps == 0))
    return rows
