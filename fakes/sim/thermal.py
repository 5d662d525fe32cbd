"""A small, deterministic thermal model of one liquid-cooled GPU rack, run faster than real time.

Time is the simulator's own ``t`` (seconds); nothing here reads a clock or does I/O.
The state advances in fixed sub-steps of ``SUBSTEP_S`` (explicit Euler, well inside
its stability limit), so a run does not depend on the caller's step size, and two
runs with the same scenario and seed are identical bit for bit. An event takes effect
at the first sub-step boundary at or after its ``at_s``: a snapshot taken at
``t >= at_s`` (on the sub-step grid) already shows it.

Model (one lumped node per GPU, one mixed coolant volume per node, one CDU):

* GPU die + cold plate: ``C dT/dt = P - (T - T_node)/R_eff - (T - T_inlet)/R_AIR`` with
  ``C = GPU_HEAT_CAPACITY_J_PER_K``. ``R_eff = R_PLATE * spread * plate_factor + R_conv``:
  ``spread`` is a fixed +-4 % part-to-part difference (a function of the GPU's
  position, not of the seed), ``plate_factor`` is 1 for a healthy cold plate and
  ramps up linearly when one degrades, and ``R_conv = R_CONV_NOMINAL * (flow/nominal)^-0.8``
  (turbulent convection, Dittus-Boelter) grows as the loop flow drops. The weak
  ``R_AIR`` path couples the GPU to the rack inlet air at its node's height.
* Power: ``demand = idle + util * (model limit - idle)``; ``P = min(demand, power_limit)``
  (the enforced limit: a scenario's ``power_cap`` or one set through the fake NVML,
  see nvml_bridge.SimulatedRack) then, between slowdown and shutdown temperature, the
  dynamic part is scaled down linearly to ``THROTTLE_MIN`` (thermal slowdown). A GPU at
  or above its shutdown temperature is lost (off the bus, 0 W) for the rest of the run.
* Throughput: ``(P / demand) ** 0.4`` of the job's unhindered rate (fakes/sim/throughput.py
  states the model and where the exponent comes from).
* Clock event reasons: GpuIdle at util 0; SwPowerCap when the demand reaches the power
  limit; SwThermalSlowdown at or above slowdown temperature; HwThermalSlowdown and
  HwSlowdown from one degree below shutdown.
* Memory (HBM) temperature: first order towards ``T + MEM_OFFSET_C`` with ``MEM_TAU_S``.
* Node coolant (a well-mixed volume, ``NODE_COOLANT_J_PER_K``): heated by its GPUs,
  flushed by its share of the loop flow: ``C_n dT_n/dt = sum q_gpu - m_dot c_p (T_n - T_supply)``.
  At steady state the node outlet is ``T_supply + Q/(m_dot c_p)``; the CDU return is
  the flow-weighted mix of the node outlets.
* CDU: the supply follows its setpoint (first order, ``CDU_TAU_S``) while the pump
  runs. A failed pump lets the flow decay to a few percent within seconds; the heat
  exchanger then loses effect and the supply drifts towards the return. A chiller
  failure makes the setpoint drift up at ``rate_c_per_min`` up to ``max_rise_c``; a
  restore brings it back (first order, ``RESTORE_TAU_S``). Differential pressure
  follows the system curve ``dp ~ flow^2``.
* Room and inlet: the room follows its nominal temperature; a CRAC failure makes it rise
  at ``rate_c_per_min``. Inlet probes sit evenly from bottom to top; each reads the
  room plus ``inlet_gradient_c`` times its height fraction (bottom < middle < top).
* PDU: node power = its GPUs + a fixed host overhead, which grows by ``FAN_POWER_PER_C``
  per degree of node inlet above ``FAN_START_C`` (the fans). Each node is spread over
  the three phases with a small fixed imbalance (36/32/32 %, rotated per node);
  current = P / 230 V.
* Noise: Gaussian, on snapshot outputs only, from ``random.Random`` seeded with the seed
  and the sub-step count, so a snapshot does not depend on how often one was taken.

Typical numbers (H100 SXM, 30 C supply, 40 L/min, 4x8 GPUs): idle ~33 C; 90 % load
~63-64 C, 100 % load ~66-68 C, reached with a time constant of ~45 s; loop delta-T ~7-8 K.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from fakes.gpus import GpuModel
from fakes.sim.scenario import RACK, Event, EventKind, Scenario, parse_event
from fakes.sim.throughput import throughput_fraction

SUBSTEP_S = 0.5
GPU_HEAT_CAPACITY_J_PER_K = 900.0
R_PLATE_K_PER_W = 0.034
R_CONV_NOMINAL_K_PER_W = 0.010
R_AIR_K_PER_W = 1.0
PART_SPREAD = 0.04
MEM_OFFSET_C = 3.0
MEM_TAU_S = 60.0
THROTTLE_MIN = 0.4
NODE_COOLANT_J_PER_K = 12_000.0  # ~3 L of PG25 in manifolds and plates
COOLANT_KG_PER_L = 1.02
COOLANT_CP_J_PER_KG_K = 3900.0
CDU_TAU_S = 20.0
HX_FULL_FLOW_FRACTION = 0.5  # the heat exchanger works fully down to this flow fraction
FLOW_FAIL_TAU_S = 2.0
FLOW_RESTORE_TAU_S = 6.0
PUMP_SPEED_NOMINAL_PCT = 70.0
DP_NOMINAL_KPA = 120.0
RESTORE_TAU_S = 180.0
CDU_ALARM_SUPPLY_RISE_C = 5.0
FAN_START_C = 27.0  # host fans ramp up above this inlet temperature
FAN_POWER_PER_C = 0.03  # host overhead grows 3 % per degree above FAN_START_C
MAINS_V = 230.0
PHASES = ("L1", "L2", "L3")
PHASE_SHARE = (0.36, 0.32, 0.32)

GPU_IDLE = 0x1
SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
SW_THERMAL_SLOWDOWN = 0x20
HW_THERMAL_SLOWDOWN = 0x40

_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class GpuSnapshot:
    """One GPU as its sensors report it; temperatures in C, power in W, utilization in %."""

    index: int
    temperature_c: float
    memory_temperature_c: float
    power_w: float
    power_limit_w: float
    utilization: float
    clock_event_reasons: int
    dropped_out: bool
    lost: bool
    # Work rate against the job's unhindered rate (cap, thermal slowdown); see throughput.py.
    throughput: float = 1.0


@dataclass(frozen=True, slots=True)
class NodeSnapshot:
    """One node: its GPUs and its total power (GPUs + host overhead)."""

    name: str
    gpus: tuple[GpuSnapshot, ...]
    power_w: float


@dataclass(frozen=True, slots=True)
class CduSnapshot:
    """The coolant distribution unit's telemetry."""

    supply_c: float
    return_c: float
    flow_lpm: float
    differential_pressure_kpa: float
    pump_speed_pct: float
    pump_running: bool
    leak: bool
    alarm: bool
    answering: bool = True  # False while the unit is silent: its clients get no data


@dataclass(frozen=True, slots=True)
class RackSnapshot:
    """Everything every fake reports at simulated time `t`."""

    t: float
    nodes: tuple[NodeSnapshot, ...]
    cdu: CduSnapshot
    inlet_c: Mapping[str, float]
    pdu_power_w: Mapping[str, float]
    pdu_current_a: Mapping[str, float]
    events_active: tuple[str, ...]

    def node(self, name: str) -> NodeSnapshot:
        """The node called `name` (KeyError if none)."""
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)


class _SimGpu:
    """One simulated GPU: its cold plate, load, temperatures and faults."""

    __slots__ = (
        "dropout_until",
        "limit_w",
        "lost",
        "mem",
        "plate_from",
        "plate_ramp",
        "plate_t0",
        "plate_to",
        "r_plate",
        "temp",
        "util",
    )

    def __init__(self, r_plate: float, limit_w: float) -> None:
        self.r_plate = r_plate
        self.limit_w = limit_w
        self.util = 0.0
        self.temp = 0.0
        self.mem = 0.0
        self.lost = False
        self.plate_from = 1.0
        self.plate_to = 1.0
        self.plate_t0 = 0.0
        self.plate_ramp = 0.0
        self.dropout_until = -1.0

    def plate(self, t: float) -> float:
        if self.plate_ramp <= 0.0 or t >= self.plate_t0 + self.plate_ramp:
            return self.plate_to
        frac = (t - self.plate_t0) / self.plate_ramp
        return self.plate_from + (self.plate_to - self.plate_from) * frac


class RackSimulator:
    """The thermal model of one rack; `step` it forward and read `snapshot`s."""

    def __init__(self, scenario: Scenario, *, seed: int | None = None) -> None:
        self.scenario = scenario
        self.seed = scenario.seed if seed is None else seed
        rack, fac = scenario.rack, scenario.facility
        self.model: GpuModel = rack.model
        self._k = 0  # sub-steps done; physics time is _k * SUBSTEP_S
        self._t = 0.0  # the caller's time, >= physics time
        self._next_event = 0
        n_nodes = len(rack.nodes)
        self._gpus: list[list[_SimGpu]] = []
        for k in range(n_nodes):
            row = []
            for i in range(rack.gpus_per_node):
                spread = ((k * rack.gpus_per_node + i) * 7919 % 17) / 8.0 - 1.0
                r = R_PLATE_K_PER_W * (1.0 + PART_SPREAD * spread)
                row.append(_SimGpu(r, self.model.power_limit_w))
            self._gpus.append(row)
        self._node_height = [(k + 0.5) / n_nodes for k in range(n_nodes)]
        p = len(rack.probes)
        self._probe_height = [j / (p - 1) if p > 1 else 0.5 for j in range(p)]
        self._node_c = [fac.supply_setpoint_c] * n_nodes
        self._supply_c = fac.supply_setpoint_c
        self._setpoint_c = fac.supply_setpoint_c
        self._room_c = fac.room_c
        self._flow_lpm = fac.flow_lpm
        self._pump_running = True
        self._residual = 0.03
        self._chiller: tuple[float, float] | None = None  # (rate C/s, cap C)
        self._crac: tuple[float, float] | None = None
        self._leak = False
        self._silent_until = -1.0
        self._apply_due_events()
        self._settle()

    @property
    def t(self) -> float:
        """Simulated seconds since the start of the scenario."""
        return self._t

    def step(self, dt: float) -> None:
        """Advance by `dt` simulated seconds (in whole fixed sub-steps)."""
        if dt < 0 or math.isnan(dt):
            raise ValueError(f"dt must be >= 0, got {dt}")
        self._t += dt
        while (self._k + 1) * SUBSTEP_S <= self._t + _EPS:
            self._substep()

    def run_until(self, t: float) -> None:
        """Advance to simulated time `t` (no-op if already there)."""
        if t > self._t:
            self.step(t - self._t)

    def inject(
        self,
        kind: str,
        target: str | None = None,
        *,
        gpu: int | None = None,
        **params: float | bool,
    ) -> Event:
        """Apply an event now, outside the timeline; validated like a scenario event."""
        # E.g. a fake scheduler stopping a drained node's jobs: inject("job_stop", "gpu-node-02").
        data: dict[str, object] = {"at_s": self._k * SUBSTEP_S, "kind": kind, **params}
        if target is not None:
            data["target"] = target
        if gpu is not None:
            data["gpu"] = gpu
        event = parse_event(data, self.scenario.rack, where="inject")
        self._apply(event, self._k * SUBSTEP_S)
        return event

    # -- physics --------------------------------------------------------------

    def _power(self, g: _SimGpu, temp: float) -> tuple[float, float]:
        """(power W, uncapped demand W) of a GPU at die temperature `temp`."""
        if g.lost:
            return 0.0, 0.0
        m = self.model
        demand = m.idle_power_w + g.util * (m.power_limit_w - m.idle_power_w)
        p = min(demand, g.limit_w)
        over = (temp - m.slowdown_c) / (m.shutdown_c - m.slowdown_c)
        if over > 0.0:
            scale = 1.0 - (1.0 - THROTTLE_MIN) * min(over, 1.0)
            p = m.idle_power_w + (p - m.idle_power_w) * scale if p > m.idle_power_w else p
        return p, demand

    def _inlet(self, height: float) -> float:
        return self._room_c + self.scenario.facility.inlet_gradient_c * height

    def _flow_fraction(self) -> float:
        return max(self._flow_lpm / self.scenario.facility.flow_lpm, 1e-3)

    def _node_mcp(self) -> float:
        """Heat capacity flow (W/K) of one node's share of the loop."""
        kg_s = self._flow_lpm / 60.0 * COOLANT_KG_PER_L
        return kg_s * COOLANT_CP_J_PER_KG_K / len(self._gpus)

    def _settle(self) -> None:
        """Put every temperature at the steady state of the initial load (no throttling)."""
        t = 0.0
        r_conv = R_CONV_NOMINAL_K_PER_W * self._flow_fraction() ** -0.8
        mcp = self._node_mcp()
        g_a = 1.0 / R_AIR_K_PER_W
        for k, row in enumerate(self._gpus):
            t_air = self._inlet(self._node_height[k])
            num = mcp * self._supply_c
            den = mcp
            for g in row:
                p, _ = self._power(g, 0.0)
                g_c = 1.0 / (g.r_plate * g.plate(t) + r_conv)
                num += g_c * (p + g_a * t_air) / (g_c + g_a)
                den += g_c * g_a / (g_c + g_a)
            t_n = num / den
            self._node_c[k] = t_n
            for g in row:
                p, _ = self._power(g, 0.0)
                g_c = 1.0 / (g.r_plate * g.plate(t) + r_conv)
                g.temp = (p + g_c * t_n + g_a * t_air) / (g_c + g_a)
                g.mem = g.temp + MEM_OFFSET_C

    def _substep(self) -> None:
        h = SUBSTEP_S
        now = self._k * h
        fac = self.scenario.facility

        # Loop flow, setpoint and room: first order or ramps.
        target_flow = fac.flow_lpm * (1.0 if self._pump_running else self._residual)
        tau = FLOW_RESTORE_TAU_S if self._pump_running else FLOW_FAIL_TAU_S
        self._flow_lpm += (target_flow - self._flow_lpm) * (1.0 - math.exp(-h / tau))
        restore = 1.0 - math.exp(-h / RESTORE_TAU_S)
        if self._chiller is not None:
            rate, cap = self._chiller
            self._setpoint_c = min(self._setpoint_c + rate * h, fac.supply_setpoint_c + cap)
        else:
            self._setpoint_c += (fac.supply_setpoint_c - self._setpoint_c) * restore
        if self._crac is not None:
            rate, cap = self._crac
            self._room_c = min(self._room_c + rate * h, fac.room_c + cap)
        else:
            self._room_c += (fac.room_c - self._room_c) * restore

        # GPUs and node coolant (all derivatives from the state at the start of the sub-step).
        flow_frac = self._flow_fraction()
        r_conv = R_CONV_NOMINAL_K_PER_W * flow_frac**-0.8
        mcp = self._node_mcp()
        supply = self._supply_c
        g_a = 1.0 / R_AIR_K_PER_W
        h_c = h / GPU_HEAT_CAPACITY_J_PER_K
        a_mem = 1.0 - math.exp(-h / MEM_TAU_S)
        shutdown = self.model.shutdown_c
        for k, row in enumerate(self._gpus):
            t_n = self._node_c[k]
            t_air = self._inlet(self._node_height[k])
            q_in = 0.0
            for g in row:
                temp = g.temp
                p, _ = self._power(g, temp)
                q_c = (temp - t_n) / (g.r_plate * g.plate(now) + r_conv)
                q_in += q_c
                g.temp = temp + h_c * (p - q_c - (temp - t_air) * g_a)
                g.mem += (temp + MEM_OFFSET_C - g.mem) * a_mem
                if g.temp >= shutdown:
                    g.lost = True
            self._node_c[k] = t_n + h * (q_in - mcp * (t_n - supply)) / NODE_COOLANT_J_PER_K

        # CDU supply: regulated to the setpoint while the heat exchanger has flow.
        ret = sum(self._node_c) / len(self._node_c)
        hx = min(1.0, flow_frac / HX_FULL_FLOW_FRACTION)
        target = self._setpoint_c + (1.0 - hx) * (ret - self._setpoint_c)
        self._supply_c += (target - supply) * (1.0 - math.exp(-h / CDU_TAU_S))
        self._k += 1
        self._apply_due_events()

    def _apply_due_events(self) -> None:
        """Apply the timeline's events due at the current physics time."""
        now = self._k * SUBSTEP_S
        events = self.scenario.events
        while self._next_event < len(events) and events[self._next_event].at_s <= now + _EPS:
            self._apply(events[self._next_event], now)
            self._next_event += 1

    def _targets(self, ev: Event) -> list[_SimGpu]:
        nodes = self.scenario.rack.nodes
        rows = self._gpus if ev.target == RACK else [self._gpus[nodes.index(ev.target)]]
        if ev.gpu is not None:
            return [row[ev.gpu] for row in rows]
        return [g for row in rows for g in row]

    def _apply(self, ev: Event, now: float) -> None:
        kind = ev.kind
        if kind is EventKind.JOB_START:
            for g in self._targets(ev):
                g.util = ev.num("util")
        elif kind is EventKind.JOB_STOP:
            for g in self._targets(ev):
                g.util = 0.0
        elif kind is EventKind.POWER_CAP:
            for g in self._targets(ev):
                g.limit_w = min(ev.num("limit_w"), self.model.power_limit_w)
        elif kind in (EventKind.COLD_PLATE_DEGRADE, EventKind.COLD_PLATE_REPAIR):
            (g,) = self._targets(ev)
            g.plate_from = g.plate(now)
            g.plate_to = ev.num("factor") if kind is EventKind.COLD_PLATE_DEGRADE else 1.0
            g.plate_t0 = now
            g.plate_ramp = ev.num("ramp_s")
        elif kind is EventKind.SENSOR_DROPOUT:
            (g,) = self._targets(ev)
            g.dropout_until = now + ev.num("duration_s")
        elif kind is EventKind.PUMP_FAIL:
            self._pump_running = False
            self._residual = ev.num("residual_flow_pct") / 100.0
        elif kind is EventKind.PUMP_RESTORE:
            self._pump_running = True
        elif kind is EventKind.CHILLER_FAIL:
            self._chiller = (ev.num("rate_c_per_min") / 60.0, ev.num("max_rise_c"))
        elif kind is EventKind.CHILLER_RESTORE:
            self._chiller = None
        elif kind is EventKind.CRAC_FAIL:
            self._crac = (ev.num("rate_c_per_min") / 60.0, ev.num("max_rise_c"))
        elif kind is EventKind.CRAC_RESTORE:
            self._crac = None
        elif kind is EventKind.LEAK:
            self._leak = bool(ev.params["active"])
        elif kind is EventKind.CDU_SILENT:
            self._silent_until = now + ev.num("duration_s")

    # -- outputs --------------------------------------------------------------

    def snapshot(self, *, noise: bool = True) -> RackSnapshot:
        """What the sensors report now; `noise=False` gives the model's true state."""
        rng = random.Random(self.seed * 1_000_003 + self._k)
        sd_t = self.scenario.noise.temperature_c if noise else 0.0
        sd_p = self.scenario.noise.power_w if noise else 0.0

        def jitter(sd: float) -> float:
            return rng.gauss(0.0, sd) if sd > 0.0 else 0.0

        m = self.model
        now = self._k * SUBSTEP_S
        rack = self.scenario.rack
        nodes: list[NodeSnapshot] = []
        active: list[str] = []
        node_power: list[float] = []
        for k, (name, row) in enumerate(zip(rack.nodes, self._gpus, strict=True)):
            gpus: list[GpuSnapshot] = []
            fans = FAN_POWER_PER_C * max(0.0, self._inlet(self._node_height[k]) - FAN_START_C)
            total = rack.host_overhead_w * (1.0 + fans)
            capped = False
            for i, g in enumerate(row):
                p, demand = self._power(g, g.temp)
                total += p
                reasons = 0
                if not g.lost:
                    if g.util <= 0.0:
                        reasons |= GPU_IDLE
                    if demand >= g.limit_w - 0.5 and demand > m.idle_power_w:
                        reasons |= SW_POWER_CAP
                    if g.temp >= m.slowdown_c:
                        reasons |= SW_THERMAL_SLOWDOWN
                    if g.temp >= m.shutdown_c - 1:
                        reasons |= HW_THERMAL_SLOWDOWN | HW_SLOWDOWN
                dropped = now < g.dropout_until
                gpus.append(
                    GpuSnapshot(
                        index=i,
                        temperature_c=g.temp + jitter(sd_t),
                        memory_temperature_c=g.mem + jitter(sd_t),
                        power_w=max(0.0, p + jitter(sd_p)) if not g.lost else 0.0,
                        power_limit_w=g.limit_w,
                        utilization=0.0 if g.lost else g.util * 100.0,
                        clock_event_reasons=reasons,
                        dropped_out=dropped,
                        lost=g.lost,
                        throughput=0.0 if g.lost else throughput_fraction(p, demand),
                    )
                )
                if g.plate(now) > 1.0 + 1e-6 or g.plate_to > 1.0:
                    active.append(f"cold_plate_degrade:{name}/{i}")
                if dropped:
                    active.append(f"sensor_dropout:{name}/{i}")
                capped = capped or g.limit_w < m.power_limit_w
            if capped:
                active.append(f"power_cap:{name}")
            node_power.append(total)
            nodes.append(NodeSnapshot(name, tuple(gpus), total + jitter(sd_p)))

        phase = dict.fromkeys(PHASES, 0.0)
        for k, p in enumerate(node_power):
            for j, ph in enumerate(PHASES):
                phase[ph] += p * PHASE_SHARE[(j - k) % len(PHASES)]
        power = {ph: w + jitter(sd_p) for ph, w in phase.items()}
        current = {ph: w / MAINS_V for ph, w in power.items()}

        fac = self.scenario.facility
        flow_frac = self._flow_lpm / fac.flow_lpm
        cdu = CduSnapshot(
            supply_c=self._supply_c + jitter(sd_t),
            return_c=sum(self._node_c) / len(self._node_c) + jitter(sd_t),
            flow_lpm=max(0.0, self._flow_lpm * (1.0 + jitter(0.005 if noise else 0.0))),
            differential_pressure_kpa=DP_NOMINAL_KPA * flow_frac**2,
            pump_speed_pct=PUMP_SPEED_NOMINAL_PCT if self._pump_running else 0.0,
            pump_running=self._pump_running,
            leak=self._leak,
            alarm=(
                self._leak
                or not self._pump_running
                or flow_frac < 0.5
                or self._supply_c > fac.supply_setpoint_c + CDU_ALARM_SUPPLY_RISE_C
            ),
            answering=now >= self._silent_until,
        )
        inlet = {
            label: self._inlet(hgt) + jitter(sd_t)
            for label, hgt in zip(rack.probes, self._probe_height, strict=True)
        }
        if not self._pump_running:
            active.append("pump_fail")
        if self._chiller is not None:
            active.append("chiller_fail")
        if self._crac is not None:
            active.append("crac_fail")
        if self._leak:
            active.append("leak")
        if not cdu.answering:
            active.append("cdu_silent")
        return RackSnapshot(
            t=self._t,
            nodes=tuple(nodes),
            cdu=cdu,
            inlet_c=MappingProxyType(inlet),
            pdu_power_w=MappingProxyType(power),
            pdu_current_a=MappingProxyType(current),
            events_active=tuple(sorted(active)),
        )
