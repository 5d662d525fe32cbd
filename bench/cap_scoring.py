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

from dataclasses import dataclass, field

from fakes.sim import load_scenario
from fakes.sim.scoring import onset
from fakes.sim.thermal import RackSimulator
from fakes.sim.trace_writer import RACK_NAME, WALL_EPOCH, gpu_readings, rack_readings
from policies.model import Action, Reading
from policies.policy import Policy
from policies.power_cap import CapAction, CapLadder, CapSettings
from policies.safety import ClusterLedger
from policies.settings import PolicySettings


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


def run_ladder(name: str, settings: PolicySettings, *, caps: bool) -> LadderRun:
    """Run scenario ``name`` closed loop, with or without the cap rung."""
    sc = load_scenario(name)
    sim = RackSimulator(sc)
    racks = {RACK_NAME: sc.rack.nodes}
    policy = Policy(settings, racks)
    model = sc.rack.model
    if caps:
        ladder = CapLadder(CapSettings())
        for node in sc.rack.nodes:
            for i in range(sc.rack.gpus_per_node):
                ladder.observe_limit(node, str(i), model.min_power_limit_w, model.power_limit_w)
        policy.caps = ladder
    ledger = ClusterLedger(racks, max(settings.storm_window_s, settings.resume_window_s))
    run = LadderRun(name, caps, onset_s=onset(sc))
    steps = int(sc.duration_s)
    for k in range(steps + 1):
        t = float(k)
        sim.run_until(t)
        snap = sim.snapshot()
        readings: list[Reading] = gpu_readings(snap, sc, WALL_EPOCH)
        if k % 5 == 0:
            readings += rack_readings(snap, RACK_NAME, WALL_EPOCH, sc.rack.empty_probe_slots)
        policy.observe(readings)
        outcomes = policy.evaluate(t, WALL_EPOCH + t, ledger.view(t))
        for node, o in outcomes.items():
            d = o.decision
            if d is not None:
                ledger.record(d, t, critical=o.critical, following=o.following)
                run.log.append((t, f"{node}: {d.action.value} ({d.reason})"))
                if d.action is not Action.RESUME:
                    run.first_out.setdefault(node, t)
        for c in policy.cap_decisions:
            run.log.append((t, f"{c.node} gpu{c.gpu}: {c.action.value} {c.watts:.0f}W"))
            if c.action is CapAction.CAP:
                run.capped_gpus.add(f"{c.node}/gpu{c.gpu}")
            if c.action is not CapAction.RELEASE:
                sim.inject("power_cap", c.node, gpu=int(c.gpu), limit_w=c.watts)
        for ns in snap.nodes:
            out = policy.states[ns.name].action is not Action.RESUME
            for g in ns.gpus:
                if g.temperature_c >= model.slowdown_c and not g.lost:
                    run.slowdown_gpu_s += 1.0
                    if run.first_slowdown_s is None:
                        run.first_slowdown_s = t
                run.given_up_gpu_s += 1.0 if out else 1.0 - g.throughput
    return run
