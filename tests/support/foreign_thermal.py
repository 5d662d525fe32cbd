"""A thermal model of a liquid-cooled rack written apart from fakes/sim, for the policy's tests.

Physics, per GPU (a lumped RC network; heat flows die -> cold plate -> coolant):

* die: quasi-static (its own time constant is well under a second),
  ``T_die = T_plate + R_jc * P``;
* cold plate and the coolant in it, heat capacity ``C_p``:
  ``C_p dT_plate/dt = P - G(f) (T_plate - T_supply) - G_leak (T_plate - T_supply)``,
  where ``G(f)`` is the plate's conductance to the coolant at flow fraction ``f``
  (effectiveness-NTU: ``m c_p (1 - exp(-hA / m c_p))``, ``m c_p`` proportional to
  the flow, ``hA`` to its 0.8th power), and ``G_leak`` the chassis path that
  remains with no flow;
* at nominal flow ``R_total = R_jc + 1 / G(1)`` and ``tau = C_p / G(1)``, so the
  steady temperature is ``T_supply + R_total * P``;
* the GPU throttles at its slowdown temperature (it draws no more power than
  keeps the die there).

The rack's loop (one CDU): the coolant, heat capacity ``C_loop``, takes the heat
of every plate, and the CDU's heat exchanger removes it, controlled to hold the
supply at its setpoint: ``Q_hx = clip(Q_in + K (T_supply - T_set), 0, f Q_cap)``
(no flow through the exchanger, no heat out of the loop). The return is
``T_supply + Q_in / (m c_p)`` of the whole loop.

Output as NVML and a polled CDU report it: GPU temperature in whole degrees
(truncated), power with load noise, polls with jitter, now and then late,
missing or BAD; CDU supply, return, flow and pump state every few seconds.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import MappingProxyType

from policies.model import Quality, Reading, SensorKind
from policies.trace import encode_header, encode_reading

WATER_J_PER_KG_K = 4186.0
WALL_EPOCH = 1_767_225_600.0


@dataclass(frozen=True, slots=True)
class Part:
    """One GPU model on its cold plate."""

    name: str
    r_total_c_per_w: float  # die to coolant supply at nominal flow
    tau_s: float  # the plate's time constant at nominal flow
    power_limit_w: float
    idle_w: float
    slowdown_c: float
    shutdown_c: float
    r_jc_share: float = 0.4  # the part of R_total between die and plate (die, TIM)
    flow_lpm: float = 2.0  # coolant through one plate at nominal flow


# An H100 SXM on a cold plate (thresholds roughly as nvidia-smi -q reports them).
H100 = Part("h100", 0.055, 30.0, 700.0, 90.0, 89.0, 92.0)
# A hotter part: more power through a plate of lower resistance, less margin at full load.
HOT = Part("hot-1kw", 0.042, 30.0, 1000.0, 150.0, 87.0, 92.0)


@dataclass(frozen=True, slots=True)
class Loop:
    """The rack's coolant loop and its CDU."""

    setpoint_c: float = 30.0
    heat_capacity_j_per_k: float = 60.0 * WATER_J_PER_KG_K  # ~60 L of water and pipe
    hx_capacity_w: float = 60_000.0
    control_s: float = 30.0  # the supply control's closed-loop time constant
    hunting_c: float = 0.2  # the valve's hunting around the setpoint (amplitude)
    hunting_period_s: float = 420.0


def steady(_t: float) -> float:
    """Full flow; also the load of a GPU at its power limit."""
    return 1.0


def training_load(seed: int, low: float = 300.0, high: float = 700.0) -> Callable[[float], float]:
    """Watts over time: compute phases at ``high`` and dips (checkpoint, eval) at ``low``."""
    rng = random.Random(seed)
    edges: list[tuple[float, float]] = []
    t = 0.0
    while t < 86_400.0:
        edges.append((t, high))
        t += rng.uniform(120.0, 300.0)
        edges.append((t, low))
        t += rng.uniform(30.0, 120.0)

    def watts(t: float) -> float:
        lo, hi = 0, len(edges) - 1
        while lo < hi:  # the last edge at or before t
            mid = (lo + hi + 1) // 2
            if edges[mid][0] <= t:
                lo = mid
            else:
                hi = mid - 1
        return edges[lo][1]

    return watts


def pump_failure(
    at_s: float, residual: float = 0.02, spin_down_s: float = 3.0
) -> Callable[[float], float]:
    """Flow fraction: the pump stops at ``at_s`` and the flow coasts down to ``residual``."""

    def flow(t: float) -> float:
        if t < at_s:
            return 1.0
        return residual + (1.0 - residual) * math.exp(-(t - at_s) / spin_down_s)

    return flow


def supply_drift(setpoint_c: float, at_s: float, c_per_min: float) -> Callable[[float], float]:
    """The setpoint the CDU can hold: the facility water warming from ``at_s`` on."""
    return lambda t: setpoint_c + max(0.0, t - at_s) * c_per_min / 60.0


@dataclass(slots=True)
class Scenario:
    """One rack of ``nodes`` x ``gpus`` GPUs over ``duration_s``."""

    part: Part
    duration_s: float
    load: Callable[[float], float] | None = None  # watts; None: the power limit
    flow: Callable[[float], float] = steady
    setpoint: Callable[[float], float] | None = None  # None: the loop's
    pump_stops_at: float | None = None  # the CDU reports its pump stopped from then on
    loop: Loop = field(default_factory=Loop)
    nodes: int = 2
    gpus: int = 4
    gpu_period_s: float = 1.0
    cdu_period_s: float | None = 5.0  # None: no cooling unit rackguard can read
    miss_p: float = 0.02  # a GPU poll that returns nothing
    bad_p: float = 0.002  # a temperature read that fails (NVML_ERROR_UNKNOWN)
    late_p: float = 0.01  # a poll late by up to half its period
    power_noise: float = 0.04  # load noise, relative, correlated over ~2 s
    spread: float = 0.05  # GPU-to-GPU variation of R_total (relative, 1 sigma)
    seed: int = 1
    degraded: float = 1.0  # the first GPU's plate: its R_total times this (dried paste, air)


@dataclass(slots=True)
class Run:
    """A scenario's trace and its ground truth."""

    lines: list[str]
    slowdown_at: dict[str, float]  # node -> when its first GPU's die reached slowdown
    peak_die_c: dict[str, float]  # node -> its hottest die temperature

    @property
    def readings(self) -> int:
        return len(self.lines) - 1


def node_names(s: Scenario) -> list[str]:
    return [f"n{i + 1}" for i in range(s.nodes)]


def simulate(s: Scenario) -> Run:
    """The scenario's trace lines (header first, readings in time order) and truth."""
    rng = random.Random(s.seed)
    p, loop = s.part, s.loop
    names = node_names(s)
    dt = min(0.5, s.gpu_period_s / 2)
    g_nom = 1.0 / (p.r_total_c_per_w * (1.0 - p.r_jc_share))
    m_cp = p.flow_lpm / 60.0 * WATER_J_PER_KG_K  # W/K through one plate
    ha_nom = -m_cp * math.log(1.0 - g_nom / m_cp)
    c_plate = p.tau_s * g_nom
    g_leak = 0.5
    # GPU-to-GPU variation: each plate's conductance and die resistance scaled alike.
    scale = [max(0.7, 1.0 + s.spread * rng.gauss(0.0, 1.0)) for _ in range(s.nodes * s.gpus)]
    scale[0] *= s.degraded
    r_jc = [p.r_total_c_per_w * p.r_jc_share * k for k in scale]
    load = s.load or (lambda _t: p.power_limit_w)
    setpoint = s.setpoint or (lambda _t: loop.setpoint_c)
    supply = setpoint(0.0)
    watts0 = load(0.0)
    plate = [supply + watts0 / (g_nom / k) for k in scale]
    noise = [0.0] * len(plate)
    loop_m_cp = s.nodes * s.gpus * m_cp
    gain = loop.heat_capacity_j_per_k / loop.control_s
    cache: dict[float, list[tuple[float, float, float]]] = {}

    def plates(f: float) -> list[tuple[float, float, float]]:
        """Per GPU at flow fraction ``f``: to the coolant, in all, the plate's decay per step."""
        got = cache.get(f)
        if got is None:
            m = m_cp * f
            g = m * (1.0 - math.exp(-ha_nom * f**0.8 / m)) if m > 0 else 0.0
            got = cache[f] = [
                (g / k, g / k + g_leak, math.exp(-dt * (g / k + g_leak) / c_plate)) for k in scale
            ]
        return got

    out: list[Reading] = []
    slowdown_at: dict[str, float] = {}
    peak = dict.fromkeys(names, -math.inf)
    next_poll = [rng.uniform(0.0, s.gpu_period_s) for _ in names]
    cdu_period = s.cdu_period_s or math.inf
    next_cdu = rng.uniform(0.0, cdu_period) if s.cdu_period_s else math.inf
    rho = math.exp(-dt / 2.0)  # load noise correlated over ~2 s
    innovation = math.sqrt(1 - rho * rho)
    q_in = 0.0
    steps = int(s.duration_s / dt)
    for step in range(steps + 1):
        t = step * dt
        f = s.flow(t)
        conductances = plates(round(f, 4))
        demand = load(t)
        q_in = 0.0
        die = [0.0] * len(plate)
        power = [0.0] * len(plate)
        for i, tp in enumerate(plate):
            noise[i] = rho * noise[i] + innovation * rng.gauss(0.0, s.power_noise)
            watts = max(p.idle_w, demand * (1.0 + noise[i]))
            # Throttling: no more power than keeps the die at its slowdown temperature.
            watts = max(min(watts, (p.slowdown_c - tp) / r_jc[i]), 0.0)
            power[i] = watts
            die[i] = tp + r_jc[i] * watts
            g, g_all, decay = conductances[i]
            t_inf = supply + watts / g_all
            plate[i] = t_inf + (tp - t_inf) * decay
            q_in += g * (plate[i] - supply)
        for n, node in enumerate(names):
            hottest = max(die[n * s.gpus : (n + 1) * s.gpus])
            peak[node] = max(peak[node], hottest)
            if hottest >= p.slowdown_c - 1e-6 and node not in slowdown_at:
                slowdown_at[node] = t
        target = setpoint(t) + loop.hunting_c * math.sin(2 * math.pi * t / loop.hunting_period_s)
        q_hx = min(max(q_in + gain * (supply - target), 0.0), f * loop.hx_capacity_w)
        supply += dt * (q_in - q_hx) / loop.heat_capacity_j_per_k
        for n, node in enumerate(names):
            if t >= next_poll[n]:
                at = next_poll[n]
                next_poll[n] += s.gpu_period_s
                if rng.random() < s.late_p:
                    next_poll[n] += rng.uniform(0.0, s.gpu_period_s / 2)
                if rng.random() >= s.miss_p:
                    for k in range(s.gpus):
                        i = n * s.gpus + k
                        out += _gpu_poll(s, node, k, at, die[i], power[i], rng)
        if t >= next_cdu:
            at = next_cdu
            next_cdu += cdu_period + rng.uniform(-0.1, 0.1)
            ret = supply + q_in / max(loop_m_cp * f, 1e-9)
            out += _cdu_poll(s, t, at, supply, min(ret, 99.0), f, rng)
    out.sort(key=lambda r: r.mono)
    header = encode_header({"r1": names}, {"model": "foreign-thermal", "part": p.name})
    return Run([header, *map(encode_reading, out)], slowdown_at, peak)


def _reading(
    source: str,
    sensor: str,
    kind: SensorKind,
    value: float | None,
    unit: str,
    at: float,
    labels: MappingProxyType[str, str],
) -> Reading:
    quality = Quality.GOOD if value is not None else Quality.BAD
    reason = "" if value is not None else "NVML_ERROR_UNKNOWN: unknown error"
    return Reading(
        source, sensor, kind, value, unit, quality, at, WALL_EPOCH + at, reason, labels=labels
    )


def _gpu_poll(
    s: Scenario, node: str, k: int, at: float, die: float, watts: float, rng: random.Random
) -> Iterator[Reading]:
    labels = MappingProxyType({"node": node, "gpu": str(k)})
    temp: float | None = float(math.floor(die))
    if rng.random() < s.bad_p:
        temp = None
    # NVML reports power in milliwatts, averaged over about a second: a little read noise.
    reported = round(watts * (1.0 + rng.gauss(0.0, 0.005)), 3)
    p = s.part
    for sensor, kind, value, unit in (
        ("slowdown_threshold", SensorKind.GPU_SLOWDOWN_THRESHOLD, p.slowdown_c, "celsius"),
        ("shutdown_threshold", SensorKind.GPU_SHUTDOWN_THRESHOLD, p.shutdown_c, "celsius"),
        ("power_limit", SensorKind.GPU_POWER_LIMIT, p.power_limit_w, "watts"),
        ("power", SensorKind.GPU_POWER, reported, "watts"),
        ("temperature", SensorKind.GPU_TEMPERATURE, temp, "celsius"),
    ):
        yield _reading("gpus", f"gpu{k}.{sensor}", kind, value, unit, at, labels)


def _cdu_poll(
    s: Scenario,
    t: float,
    at: float,
    supply: float,
    ret: float,
    f: float,
    rng: random.Random,
) -> Iterator[Reading]:
    labels = MappingProxyType({"rack": "r1"})
    flow = s.nodes * s.gpus * s.part.flow_lpm * f * (1.0 + rng.gauss(0.0, 0.01))
    pump = 0.0 if s.pump_stops_at is not None and t >= s.pump_stops_at else 1.0
    for sensor, kind, value, unit in (
        ("supply", SensorKind.COOLANT_SUPPLY_TEMPERATURE, supply, "celsius"),
        ("return", SensorKind.COOLANT_RETURN_TEMPERATURE, ret, "celsius"),
        ("flow", SensorKind.COOLANT_FLOW, flow, "l/min"),
        ("pump", SensorKind.PUMP_STATE, pump, ""),
    ):
        # Temperatures: 0.1 C resolution and a little sensor noise.
        temp = kind is not SensorKind.PUMP_STATE and kind is not SensorKind.COOLANT_FLOW
        reported = round(value + rng.gauss(0.0, 0.05), 1) if temp else round(value, 2)
        yield _reading("cdu", sensor, kind, reported, unit, at, labels)
