"""A rack's evidence: a fresh leak or lost flow acts whatever else is stale, one glitch
does not, a standby pump is not lost flow, an absent probe slot is not unknown, and
facility limits (configured or the cooling unit's own) are held."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from policies import freshness, rack
from policies.model import Action, FaultDomain, Quality, Reading, SensorKind
from policies.policy import Policy
from policies.rack_tracker import SlowSeries
from policies.settings import PolicySettings, RackLimits
from tests.policies.rack_sim import (
    COOL,
    HEALTHY_CDU,
    ONE_HOT,
    RACK,
    S,
    Sim,
    actions,
    reading,
)

# -- a fresh leak (or stopped pump) acts even when another coolant series is BAD --------


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


# -- one flow glitch does not mark the loop failing -----------------------------------


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


# -- one noisy supply sample is not "supply rising" -----------------------------------


def test_one_noisy_supply_sample_is_not_a_rise() -> None:
    sim = Sim()
    sim.run(100, {"n1": COOL, "n2": COOL}, HEALTHY_CDU)
    sim.run(5, {"n1": COOL, "n2": COOL}, {**HEALTHY_CDU, "supply": 31.5})  # one sample
    assert not sim.loop().supply_rising
    sim.run(20, {"n1": COOL, "n2": COOL}, {**HEALTHY_CDU, "supply": 31.5})  # now sustained
    loop = sim.loop()
    assert loop.supply_rising and loop.supply_risen


# -- a stopped standby pump is not lost flow --------------------------------------------


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


# -- several supplies: the worst one counts, each series read once ----------------------


def test_the_highest_fresh_supply_is_the_rack_supply() -> None:
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


# -- held readings ----------------------------------------------------------------------


def test_held_rack_readings_give_at_every_second_what_a_fresh_read_gives() -> None:
    # A supply ramping toward its limit (a time to it that moves every second), then a
    # cooling unit that stops answering (series going stale, the unit silent).
    sim = Sim()
    rt = sim.policy.tracker.rack["r1"]
    margins = {"n1": 20.0, "n2": 25.0}
    held = None
    reused = forecast = stale = 0
    for t in range(1500):
        cdu = {**HEALTHY_CDU, "supply": 30.0 + t / 120, "inlet": 24.0} if t < 1400 else None
        sim.step({"n1": COOL, "n2": COOL}, cdu)
        now = sim.t - 1.0
        last, held = held, rack.rack_readings("r1", rt, now, S, held)
        fresh = rack.rack_readings("r1", rt, now, S)
        assert rack.rack_evidence("r1", held, now, margins) == rack.rack_evidence(
            "r1", fresh, now, margins
        )
        reused += held is last
        forecast += held.loop.at(now).limit_early_s is not None
        stale += not held.loop.at(now).known
    assert reused > 1000 and forecast > 100 and stale > 50


def test_held_rack_readings_are_read_again_after_a_reload() -> None:
    sim = Sim()
    sim.run(10, {"n1": COOL, "n2": COOL}, HEALTHY_CDU)
    rt = sim.policy.tracker.rack["r1"]
    held = rack.rack_readings("r1", rt, 9.0, S)
    assert rack.rack_readings("r1", rt, 9.5, S, held) is held
    tighter = replace(S, supply_limit_c=25.0)
    reread = rack.rack_readings("r1", rt, 9.5, tighter, held)
    assert reread.loop.at(9.5).over_limit and not held.loop.at(9.5).over_limit
