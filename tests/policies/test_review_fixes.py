"""Regression tests for the policy review (items 1-6, 9 and 12), one scenario or table each.

Each test reproduces the reviewer's scenario on hand-made readings: CDU series every
5 s (as the simulator and a polled CDU report them), GPUs every second.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

import msgspec
import pytest

from daemon.service.engine import PolicyEngine
from daemon.service.state import StateStore
from policies import forecast, freshness, gradient, policy, rack
from policies.attribution import AirEvidence, LoopEvidence, attribute
from policies.kernel.buckets import BucketWindow
from policies.model import Action, FaultDomain, Quality, Reading, SensorKind
from policies.policy import Outcome, Policy
from policies.rack_tracker import SlowSeries
from policies.safety import ClusterLedger, Overrides
from policies.settings import PolicySettings, RackLimits
from policies.trace import TraceError, encode_header, parse
from policies.tracking import Tracker

RACKS = {"r1": ("n1", "n2")}
S = PolicySettings(min_dwell_s=0.0, resume_after_s=30.0, resume_jitter=0.0)
COOL = (60.0, 60.0, 60.0, 60.0)
ONE_HOT = (60.0, 86.0, 60.0, 60.0)  # 4 C under slowdown: at the enter margin


def reading(
    sensor: str,
    kind: SensorKind,
    value: float | None,
    t: float,
    labels: Mapping[str, str],
    source: str = "cdu",
) -> Reading:
    quality = Quality.GOOD if value is not None else Quality.BAD
    reason = "" if value is not None else "BadSensorFailure"
    return Reading(source, sensor, kind, value, "x", quality, t, t, reason, labels=labels)


def gpus(node: str, t: float, temps: Iterable[float]) -> list[Reading]:
    out = []
    for i, temp in enumerate(temps):
        labels = MappingProxyType({"node": node, "gpu": str(i)})
        for name, kind, value in (
            ("slowdown_threshold", SensorKind.GPU_SLOWDOWN_THRESHOLD, 90.0),
            ("shutdown_threshold", SensorKind.GPU_SHUTDOWN_THRESHOLD, 95.0),
            ("power", SensorKind.GPU_POWER, 600.0),
            ("power_limit", SensorKind.GPU_POWER_LIMIT, 700.0),
            ("temperature", SensorKind.GPU_TEMPERATURE, temp),
        ):
            out.append(reading(f"gpu{i}.{name}", kind, value, t, labels, "gpus"))
    return out


RACK = MappingProxyType({"rack": "r1"})
HEALTHY_CDU: dict[str, float | None] = {
    "supply": 30.0,
    "return": 37.0,
    "flow": 100.0,
    "pump": 1.0,
    "leak": 0.0,
}
CDU_KINDS = {
    "supply": SensorKind.COOLANT_SUPPLY_TEMPERATURE,
    "return": SensorKind.COOLANT_RETURN_TEMPERATURE,
    "flow": SensorKind.COOLANT_FLOW,
    "pump": SensorKind.PUMP_STATE,
    "pump2": SensorKind.PUMP_STATE,
    "leak": SensorKind.LEAK,
    "inlet": SensorKind.INLET_TEMPERATURE,
    "supply_limit": SensorKind.COOLANT_SUPPLY_LIMIT,
}


def cdu(t: float, values: Mapping[str, float | None]) -> list[Reading]:
    """One CDU/PDU poll: every named series (None: a BAD reading)."""
    return [reading(name, CDU_KINDS[name], v, t, RACK) for name, v in values.items()]


@dataclass
class Sim:
    """Two nodes of one rack, a ledger for the peers' view, one second per step."""

    settings: PolicySettings = S
    t: float = 0.0
    policy: Policy = field(init=False)
    ledger: ClusterLedger = field(init=False)

    def __post_init__(self) -> None:
        self.policy = Policy(self.settings, RACKS)
        self.ledger = ClusterLedger(RACKS, 600.0)

    def step(
        self, temps: Mapping[str, Iterable[float]], rack: Mapping[str, float | None] | None
    ) -> dict[str, Outcome]:
        readings = [r for n, ts in temps.items() for r in gpus(n, self.t, ts)]
        if rack is not None and self.t % 5 == 0:
            readings += cdu(self.t, rack)
        self.policy.observe(readings)
        out = self.policy.evaluate(self.t, 1e9 + self.t, self.ledger.view(self.t), Overrides())
        for o in out.values():
            if o.decision is not None:
                self.ledger.record(o.decision, self.t, critical=o.critical, following=o.following)
        self.t += 1.0
        return out

    def run(
        self,
        seconds: int,
        temps: Mapping[str, Iterable[float]],
        rack: Mapping[str, float | None] | None = None,
    ) -> list[Outcome]:
        decided = []
        for _ in range(seconds):
            decided += [o for o in self.step(temps, rack).values() if o.decision is not None]
        return decided

    def loop(self) -> LoopEvidence:
        return rack.loop_evidence(
            "r1", self.policy.tracker.rack["r1"], self.t - 1.0, self.policy.settings
        )


def actions(decided: list[Outcome]) -> list[tuple[str, Action, FaultDomain]]:
    return [(o.decision.node, o.decision.action, o.decision.domain) for o in decided if o.decision]


# -- 1. a fresh leak (or stopped pump) acts even when another coolant series is BAD --------


def test_leak_excludes_the_rack_even_with_another_coolant_series_bad() -> None:
    sim = Sim()
    assert sim.run(20, {"n1": COOL, "n2": COOL}, HEALTHY_CDU) == []
    decided = sim.run(6, {"n1": COOL, "n2": COOL}, {**HEALTHY_CDU, "return": None, "leak": 1.0})
    assert sorted(actions(decided)) == [
        ("n1", Action.EXCLUDE, FaultDomain.COOLING_LOOP),
        ("n2", Action.EXCLUDE, FaultDomain.COOLING_LOOP),
    ]
    assert all(o.critical for o in decided)


def test_failing_loop_excludes_even_with_another_coolant_series_bad() -> None:
    sim = Sim()
    sim.run(60, {"n1": COOL, "n2": COOL}, HEALTHY_CDU)
    failing = {**HEALTHY_CDU, "return": None, "pump": 0.0, "flow": 2.0, "supply": 36.0}
    # Lost flow, confirmed on fresh samples: both nodes drained, though one series is BAD.
    drained = sim.run(20, {"n1": COOL, "n2": COOL}, failing)
    assert actions(drained) == [
        ("n1", Action.DRAIN, FaultDomain.COOLING_LOOP),
        ("n2", Action.DRAIN, FaultDomain.COOLING_LOOP),
    ]
    decided = sim.run(5, {"n1": ONE_HOT, "n2": COOL}, failing)
    assert actions(decided) == [("n1", Action.EXCLUDE, FaultDomain.COOLING_LOOP)]
    assert decided[0].critical
    assert decided[0].decision is not None
    assert decided[0].decision.reason.startswith("rackguard: cooling loop failing (pump stopped")


def test_a_loop_out_node_is_not_healthy_while_a_coolant_series_is_bad() -> None:
    """``known`` still gates "healthy": the leak cleared, but the return probe is BAD."""
    sim = Sim()
    sim.run(10, {"n1": COOL, "n2": COOL}, HEALTHY_CDU)
    sim.run(5, {"n1": COOL, "n2": COOL}, {**HEALTHY_CDU, "return": None, "leak": 1.0})
    assert sim.policy.states["n1"].action is Action.EXCLUDE
    assert sim.run(120, {"n1": COOL, "n2": COOL}, {**HEALTHY_CDU, "return": None}) == []
    decided = sim.run(60, {"n1": COOL, "n2": COOL}, HEALTHY_CDU)
    assert {a for _, a, _ in actions(decided)} == {Action.RESUME}


# -- 2. a restored rack-wide drain waits for the rack's evidence ------------------------


def test_restored_loop_drain_does_not_resume_before_loop_evidence_is_seen() -> None:
    sim = Sim()
    sim.policy.restore("n1", Action.DRAIN, 0.0, domain=FaultDomain.COOLING_LOOP)
    assert sim.policy.states["n1"].domain is FaultDomain.COOLING_LOOP
    # GPUs cool, no CDU readings yet (its source not polled yet after the restart).
    assert sim.run(120, {"n1": COOL, "n2": COOL}) == []
    # The loop is still failing when its readings arrive: n1 stays out (n2, in service,
    # is drained for the lost flow).
    failing = {**HEALTHY_CDU, "pump": 0.0, "flow": 2.0}
    drained = sim.run(120, {"n1": COOL, "n2": COOL}, failing)
    assert actions(drained) == [("n2", Action.DRAIN, FaultDomain.COOLING_LOOP)]
    # Healthy loop: resume after resume_after_s.
    decided = sim.run(60, {"n1": COOL, "n2": COOL}, HEALTHY_CDU)
    assert ("n1", Action.RESUME, FaultDomain.NONE) in actions(decided)


def test_restored_rack_drain_waits_for_inlet_air() -> None:
    sim = Sim()
    sim.policy.restore("n1", Action.EXCLUDE, 0.0, domain=FaultDomain.RACK)
    assert sim.run(120, {"n1": COOL, "n2": COOL}) == []
    decided = sim.run(60, {"n1": COOL, "n2": COOL}, {"inlet": 24.0})
    assert actions(decided) == [("n1", Action.RESUME, FaultDomain.NONE)]


def test_restored_gpu_drain_resumes_on_gpu_evidence_alone() -> None:
    sim = Sim()
    sim.policy.restore("n1", Action.DRAIN, 0.0, domain=FaultDomain.GPU)
    decided = sim.run(60, {"n1": COOL, "n2": COOL})
    assert actions(decided) == [("n1", Action.RESUME, FaultDomain.NONE)]


def test_engine_restore_takes_the_domain() -> None:
    engine = PolicyEngine("n", S, StateStore(), lambda d: None, rack="r1")
    engine.restore(Action.DRAIN, 5.0, domain=FaultDomain.COOLING_LOOP)
    assert engine.state.action is Action.DRAIN
    assert engine.state.domain is FaultDomain.COOLING_LOOP
    assert engine.ledger.view(5.0).out["n"].domain is FaultDomain.COOLING_LOOP


# -- 3. one hot GPU is not a rack-wide event on weak shared evidence ---------------------

LOOP_OK = LoopEvidence(monitored=True, known=True)
RISEN_NO_RATE = LoopEvidence(True, True, supply_rising=True, supply_risen=True, detail="risen")
LOOP_LOST = LoopEvidence(True, True, flow_lost=True, detail="pump stopped")
LEAK = LoopEvidence(True, True, leak=True, detail="leak")
AIR_OK = AirEvidence(True, True)
AIR_WARM = AirEvidence(True, True, 0.01, detail="inlet rising")


@pytest.mark.parametrize(
    ("hot", "loop", "air", "fall", "rack_nodes", "domain"),
    [
        # The reviewer's case: a trusted inlet rise, no GPU trend, one GPU.
        (1, LOOP_OK, AIR_WARM, None, 1, FaultDomain.GPU),
        # A rise that would explain it still needs more than one GPU or node.
        (1, LOOP_OK, AIR_WARM, 0.015, 1, FaultDomain.GPU),
        (2, LOOP_OK, AIR_WARM, 0.015, 1, FaultDomain.RACK),
        (1, LOOP_OK, AIR_WARM, 0.015, 2, FaultDomain.RACK),
        # Unknown margin fall: a rate alone explains nothing.
        (3, LOOP_OK, AIR_WARM, None, 1, FaultDomain.NODE),
        # A material supply rise without a rate: the loop, for several GPUs only.
        (1, RISEN_NO_RATE, AIR_OK, None, 1, FaultDomain.GPU),
        (3, RISEN_NO_RATE, AIR_OK, None, 1, FaultDomain.COOLING_LOOP),
        # Direct evidence names the loop even for one GPU.
        (1, LOOP_LOST, AIR_OK, None, 1, FaultDomain.COOLING_LOOP),
        (1, LEAK, AIR_OK, 0.05, 1, FaultDomain.COOLING_LOOP),
    ],
)
def test_rack_wide_domains_need_broad_evidence(
    hot: int,
    loop: LoopEvidence,
    air: AirEvidence,
    fall: float | None,
    rack_nodes: int,
    domain: FaultDomain,
) -> None:
    got, _ = attribute(
        hot_gpus=hot, loop=loop, air=air, margin_fall_c_per_s=fall, rack_nodes_in_trouble=rack_nodes
    )
    assert got is domain


def test_one_hot_gpu_with_warming_inlet_drains_its_node_only() -> None:
    sim = Sim()
    temps = {"n1": COOL, "n2": COOL}
    for _ in range(240):  # inlet +0.05 C/min, trusted (an exact line beats persistence)
        sim.step(temps, {"inlet": 24.0 + 0.05 * sim.t / 60.0})
    assert rack.air_evidence("r1", sim.policy.tracker.rack["r1"], sim.t - 1, sim.policy.settings)[
        0
    ].rising
    decided = []
    for _ in range(60):
        out = sim.step({"n1": ONE_HOT, "n2": COOL}, {"inlet": 24.0 + 0.05 * sim.t / 60.0})
        decided += [o for o in out.values() if o.decision is not None]
    assert actions(decided) == [("n1", Action.DRAIN, FaultDomain.GPU)]


# -- 4. one flow glitch does not mark the loop failing -----------------------------------


def test_one_flow_glitch_does_not_mark_the_loop_failing() -> None:
    sim = Sim()
    sim.run(100, {"n1": COOL, "n2": COOL}, HEALTHY_CDU)
    sim.run(5, {"n1": COOL, "n2": COOL}, {**HEALTHY_CDU, "flow": 1000.0})  # one GOOD sample
    sim.run(500, {"n1": COOL, "n2": COOL}, HEALTHY_CDU)
    assert not sim.loop().flow_lost
    decided = sim.run(3, {"n1": ONE_HOT, "n2": COOL}, HEALTHY_CDU)
    assert actions(decided) == [("n1", Action.DRAIN, FaultDomain.GPU)]


def test_a_sustained_flow_drop_is_lost_flow_within_a_bounded_window() -> None:
    sim = Sim()
    sim.run(100, {"n1": COOL, "n2": COOL}, HEALTHY_CDU)
    sim.run(30, {"n1": COOL, "n2": COOL}, {**HEALTHY_CDU, "flow": 10.0})
    assert sim.loop().flow_lost
    # The reference is bounded: a drop older than the reference window is the new normal.
    span = max(S.trend_window_s, SlowSeries.REFERENCE_S)
    sim.run(int(span) + 30, {"n1": COOL, "n2": COOL}, {**HEALTHY_CDU, "flow": 10.0})
    assert not sim.loop().flow_lost


# -- 5. one noisy supply sample is not "supply rising" -----------------------------------


def test_one_noisy_supply_sample_is_not_a_rise() -> None:
    sim = Sim()
    sim.run(100, {"n1": COOL, "n2": COOL}, HEALTHY_CDU)
    sim.run(5, {"n1": COOL, "n2": COOL}, {**HEALTHY_CDU, "supply": 31.5})  # one sample
    assert not sim.loop().supply_rising
    sim.run(20, {"n1": COOL, "n2": COOL}, {**HEALTHY_CDU, "supply": 31.5})  # now sustained
    loop = sim.loop()
    assert loop.supply_rising and loop.supply_risen


# -- 6. non-finite values never count as readings -----------------------------------------


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("quality", [Quality.GOOD, Quality.UNCERTAIN])
def test_reading_rejects_non_finite_values(value: float, quality: Quality) -> None:
    with pytest.raises(ValueError, match=r"gpu0\.temperature: .*non-finite"):
        Reading(
            "gpus", "gpu0.temperature", SensorKind.GPU_TEMPERATURE, value, "celsius",
            quality, 1.0, 1.0, reason="" if quality is Quality.GOOD else "maybe",
        )  # fmt: skip


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity", "1e999", "-1e999"])
def test_trace_rejects_non_finite_numbers_with_the_line(token: str) -> None:
    line = (
        '{"type":"reading","source":"cdu","sensor":"supply","kind":"coolant_supply_temperature",'
        f'"value":{token},"unit":"celsius","quality":"good","mono":1.0,"wall":1.0}}'
    )
    _, records = parse([encode_header({"r1": ["n1"]}), line])
    with pytest.raises(TraceError, match=r"^line 2: non-finite number"):
        list(records)


def test_header_with_a_non_finite_number_is_rejected() -> None:
    with pytest.raises(TraceError, match=r"^line 1: non-finite number"):
        parse(['{"type":"header","format":"rackguard-trace","version":1,"racks":{},"x":NaN}'])


def test_windows_and_trackers_never_take_a_non_finite_value() -> None:
    w = BucketWindow(10.0, 60.0)
    assert w.add(1.0, 5.0) is False
    assert w.add(2.0, math.nan) is False and w.add(3.0, math.inf) is False
    w.add(11.0, 5.0)
    assert [b.value for b in w.buckets()] == [5.0]
    # A reading forged past its checks (force_setattr) is not usable, nor tracked.
    tracker = Tracker(S, {"r1": ("n1",)})
    good = gpus("n1", 0.0, [60.0])
    forged = gpus("n1", 1.0, [60.0])[-1]
    msgspec.structs.force_setattr(forged, "value", math.nan)
    tracker.observe([*good, forged])
    g = tracker.nodes["n1"].gpus["0"]
    assert not forged.usable
    assert g.margin.window.last_t == 0.0  # the NaN never reached the window
    nan_supply = cdu(2.0, {"supply": 30.0})[0]
    msgspec.structs.force_setattr(nan_supply, "value", math.inf)
    tracker.observe([nan_supply])
    assert tracker.rack["r1"].slow[SensorKind.COOLANT_SUPPLY_TEMPERATURE]
    series = next(iter(tracker.rack["r1"].slow[SensorKind.COOLANT_SUPPLY_TEMPERATURE].values()))
    assert series.raw.last_t is None and series.forecaster.window.last_t is None


# -- 9. a stopped standby pump is not lost flow --------------------------------------------


@pytest.mark.parametrize(
    ("name", "pumps", "flow", "lost"),
    [
        ("standby pump stopped, flow normal", {"pump": 1.0, "pump2": 0.0}, 100.0, False),
        ("standby pump stopped, flow low", {"pump": 1.0, "pump2": 0.0}, 10.0, True),
        ("standby pump stopped, no flow sensor", {"pump": 1.0, "pump2": 0.0}, None, True),
        ("standby pump stopped, flow BAD", {"pump": 1.0, "pump2": 0.0}, math.nan, True),
        ("every pump stopped, flow still reads normal", {"pump": 0.0, "pump2": 0.0}, 100.0, True),
        ("the only pump stopped, flow normal", {"pump": 0.0}, 100.0, True),
        ("every pump running", {"pump": 1.0, "pump2": 1.0}, 100.0, False),
    ],
)
def test_pump_stopped_counts_only_without_normal_flow(
    name: str, pumps: dict[str, float], flow: float | None, lost: bool
) -> None:
    sim = Sim()
    base: dict[str, float | None] = {"supply": 30.0, "return": 37.0, "leak": 0.0, **pumps}
    history = {**base, "pump": 1.0, "pump2": 1.0} if "pump2" in pumps else {**base, "pump": 1.0}
    if flow is not None:
        history["flow"] = 100.0
        base["flow"] = None if math.isnan(flow) else flow
    sim.run(60, {"n1": COOL, "n2": COOL}, history)
    sim.run(10, {"n1": COOL, "n2": COOL}, base)
    assert sim.loop().flow_lost is lost, name


def test_standby_pump_does_not_exclude_a_hot_node_for_the_loop() -> None:
    sim = Sim()
    both = {**HEALTHY_CDU, "pump2": 1.0}
    sim.run(100, {"n1": COOL, "n2": COOL}, both)
    # Standby pump stopped, supply up 2 C: with normal flow this is not a failing loop.
    warm = {**HEALTHY_CDU, "pump2": 0.0, "supply": 32.0}
    decided = sim.run(30, {"n1": ONE_HOT, "n2": COOL}, warm)
    assert [(n, a) for n, a, _ in actions(decided)] == [("n1", Action.DRAIN)]
    assert not decided[0].critical


# -- 12. dead code gone; the helper says what it does -------------------------------------


def test_dead_code_is_gone_and_the_highest_fresh_helper_is_named_so() -> None:
    assert not hasattr(gradient, "outliers")
    assert not hasattr(forecast.TimeToThreshold, "confident")
    assert not hasattr(policy, "_first_fresh")
    sim = Sim()
    sim.policy.observe(
        [
            reading("supply-a", SensorKind.COOLANT_SUPPLY_TEMPERATURE, 30.0, 0.0, RACK),
            reading("supply-b", SensorKind.COOLANT_SUPPLY_TEMPERATURE, 33.0, 0.0, RACK),
        ]
    )
    rt = sim.policy.tracker.rack["r1"]
    assert rack.highest_fresh(rt, SensorKind.COOLANT_SUPPLY_TEMPERATURE, 1.0, S) == 33.0


def test_loop_reads_each_coolant_series_once(monkeypatch: pytest.MonkeyPatch) -> None:
    sim = Sim()
    sim.run(1, {"n1": COOL, "n2": COOL}, {**HEALTHY_CDU, "pump2": 1.0})
    calls: list[Reading | None] = []
    real = freshness.fresh_value

    def counting(r: Reading | None, now: float, stale: float) -> float | None:
        calls.append(r)
        return real(r, now, stale)

    monkeypatch.setattr(rack, "fresh_value", counting)
    sim.loop()
    assert len(calls) == len({id(r) for r in calls}) == 6  # supply, return, flow, 2 pumps, leak


# -- absent is not unknown --------------------------------------------------------------


def _inlet_probe(t: float, probe: str, value: float | None, quality: Quality) -> Reading:
    reason = "" if quality is Quality.GOOD else f"{quality.value} slot"
    return Reading(
        "pdu",
        f"inlet.{probe}",
        SensorKind.INLET_TEMPERATURE,
        value,
        "celsius",
        quality,
        t,
        1e9 + t,
        reason=reason,
        labels={"rack": "r1", "probe": probe},
    )


@pytest.mark.parametrize(
    ("slot", "known"),
    [
        ([Quality.ABSENT] * 3, True),  # never fitted: left out
        ([Quality.GOOD, Quality.GOOD, Quality.BAD], False),  # present, then BAD: unknown
        ([Quality.GOOD, Quality.GOOD, Quality.ABSENT], False),  # present, then gone: unknown
    ],
)
def test_an_absent_probe_slot_does_not_make_the_air_unknown(
    slot: list[Quality], known: bool
) -> None:
    policy = Policy(PolicySettings(), {"r1": ("n1",)})
    for k, q in enumerate(slot):
        t = float(k)
        policy.observe([_inlet_probe(t, "top", 24.0, Quality.GOOD)])
        policy.observe([_inlet_probe(t, "slot4", 24.0 if q is Quality.GOOD else None, q)])
    air, _ = rack.air_evidence("r1", policy.tracker.rack["r1"], 2.0, policy.settings)
    assert air.monitored and air.known is known


def test_absent_reading_carries_no_value() -> None:
    with pytest.raises(ValueError, match="absent reading must not carry a value"):
        _inlet_probe(0.0, "slot4", 1.0, Quality.ABSENT)


# -- facility limits -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("unit_limit", "supply", "excluded"),
    [
        (None, 40.0, False),  # the configured 45 C: under it
        (None, 46.0, True),  # past the configured limit
        (38.0, 40.0, True),  # the cooling unit's own alarm limit wins where it reports one
    ],
)
def test_supply_at_its_limit_excludes_every_node_of_the_loop(
    unit_limit: float | None, supply: float, excluded: bool
) -> None:
    sim = Sim()
    loop = {**HEALTHY_CDU, "supply": supply}
    if unit_limit is not None:
        loop["supply_limit"] = unit_limit
    decided = sim.run(30, {"n1": COOL, "n2": COOL}, loop)
    if not excluded:
        assert decided == []
        return
    assert actions(decided) == [
        ("n1", Action.EXCLUDE, FaultDomain.COOLING_LOOP),
        ("n2", Action.EXCLUDE, FaultDomain.COOLING_LOOP),
    ]
    assert decided[0].decision is not None
    assert "coolant supply of r1 at or above its limit" in decided[0].decision.reason


def test_a_per_rack_inlet_limit_overrides_the_default() -> None:
    a3 = replace(S, racks={"r1": RackLimits(inlet_limit_c=40.0)})
    assert Sim().run(30, {"n1": COOL, "n2": COOL}, {"inlet": 35.0}) != []  # A1: past 32 C
    assert Sim(a3).run(30, {"n1": COOL, "n2": COOL}, {"inlet": 35.0}) == []


def test_one_low_supply_sample_does_not_set_the_window_low() -> None:
    # A CDU polled every 15 s puts one sample in each 10 s bucket: a noise dip is not
    # the level the supply rose from.
    series = SlowSeries(S, S.max_air_rate_c_per_min)
    for k in range(20):
        value = 29.0 if k == 7 else 30.0
        series.observe(
            Reading(
                "cdu",
                "supply",
                SensorKind.COOLANT_SUPPLY_TEMPERATURE,
                value,
                "celsius",
                Quality.GOOD,
                k * 15.0,
                k * 15.0,
            )
        )
    assert series.window_low() == pytest.approx(30.0)
