"""The rack thermal simulator: determinism, physics, the shipped scenarios, the NVML bridge."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pynvml
import pytest

from fakes.gpus import H100_SXM
from fakes.sim import (
    SUBSTEP_S,
    EventKind,
    RackSimulator,
    RackSnapshot,
    Scenario,
    ScenarioError,
    SimulatedRack,
    apply_node,
    list_scenarios,
    load_scenario,
    parse_scenario,
    thermal,
)

NODES = ["gpu-node-01", "gpu-node-02", "gpu-node-03", "gpu-node-04"]
SHIPPED = {
    "normal-load",
    "hot-gpu",
    "pump-failure",
    "chiller-loss",
    "crac-loss",
    "sensor-dropout",
    "recovery",
}
SLOWDOWN = H100_SXM.slowdown_c


def scenario(events: list[dict[str, Any]], duration_s: float = 1800, **extra: Any) -> Scenario:
    """A 4x8 H100 rack with the given timeline."""
    data: dict[str, Any] = {
        "name": "test",
        "description": "test",
        "duration_s": duration_s,
        "seed": 1,
        "rack": {"nodes": NODES},
        "events": events,
        "expect": {},
    }
    data.update(extra)
    return parse_scenario(data)


def full_load(at_s: float = 0, util: float = 1.0) -> dict[str, Any]:
    return {"at_s": at_s, "kind": "job_start", "target": "rack", "util": util}


def temps(snap: RackSnapshot) -> list[float]:
    return [g.temperature_c for n in snap.nodes for g in n.gpus]


@dataclass
class Run:
    """What a whole noiseless run of a scenario did, sampled every second."""

    scenario: Scenario
    first_crossing: tuple[float, str, int] | None = None
    crossers: dict[str, set[int]] = field(default_factory=dict)
    peak_c: float = 0.0
    final: RackSnapshot | None = None
    dropped: dict[tuple[str, int], list[float]] = field(default_factory=dict)


@cache
def run_scenario(name: str) -> Run:
    sc = load_scenario(name)
    sim = RackSimulator(sc)
    run = Run(sc)
    while sim.t < sc.duration_s:
        sim.step(1.0)
        snap = sim.snapshot(noise=False)
        for node in snap.nodes:
            for g in node.gpus:
                run.peak_c = max(run.peak_c, g.temperature_c)
                if g.dropped_out:
                    run.dropped.setdefault((node.name, g.index), []).append(snap.t)
                if g.temperature_c >= SLOWDOWN:
                    run.crossers.setdefault(node.name, set()).add(g.index)
                    if run.first_crossing is None:
                        run.first_crossing = (snap.t, node.name, g.index)
        run.final = snap
    return run


def onset(sc: Scenario, kind: EventKind) -> float:
    return next(e.at_s for e in sc.events if e.kind is kind)


# -- determinism ---------------------------------------------------------------------


def test_same_seed_gives_identical_snapshots_and_seed_only_changes_noise() -> None:
    sc = load_scenario("hot-gpu")
    a, b, c = RackSimulator(sc, seed=42), RackSimulator(sc, seed=42), RackSimulator(sc, seed=43)
    for _ in range(60):
        for sim in (a, b, c):
            sim.step(10.0)
        assert a.snapshot() == b.snapshot()
        assert a.snapshot() == a.snapshot()  # taking a snapshot does not advance the noise
        assert a.snapshot(noise=False) == c.snapshot(noise=False)
    assert temps(a.snapshot()) != temps(c.snapshot())
    noisy, true = temps(a.snapshot()), temps(a.snapshot(noise=False))
    assert max(abs(x - y) for x, y in zip(noisy, true, strict=True)) < 2.0


def test_result_does_not_depend_on_the_callers_step_size() -> None:
    sc = load_scenario("pump-failure")
    fine, coarse, odd = RackSimulator(sc), RackSimulator(sc), RackSimulator(sc)
    for checkpoint in (150.0, 240.0, 300.0):
        while fine.t < checkpoint:
            fine.step(SUBSTEP_S)
        while coarse.t + 30.0 <= checkpoint:
            coarse.step(30.0)
        coarse.run_until(checkpoint)
        while odd.t + 0.37 <= checkpoint:
            odd.step(0.37)
        assert fine.snapshot() == coarse.snapshot()
        # Off the sub-step grid the state lags the caller's time by less than one sub-step.
        diff = [
            abs(x - y)
            for x, y in zip(
                temps(fine.snapshot(noise=False)), temps(odd.snapshot(noise=False)), strict=True
            )
        ]
        assert max(diff) < 0.5


def test_step_rejects_negative_time() -> None:
    sim = RackSimulator(scenario([]))
    with pytest.raises(ValueError, match="dt"):
        sim.step(-1.0)
    sim.run_until(10.0)
    sim.run_until(5.0)  # going back is a no-op
    assert sim.t == 10.0


# -- physics -------------------------------------------------------------------------


def test_full_load_heats_with_a_tens_of_seconds_time_constant_and_idle_cools() -> None:
    sim = RackSimulator(
        scenario([full_load(60), {"at_s": 600, "kind": "job_stop", "target": "rack"}])
    )
    sim.run_until(60)
    idle = max(temps(sim.snapshot(noise=False)))
    assert 30.0 < idle < 40.0
    trace = []
    while sim.t < 600:
        sim.step(5.0)
        trace.append(sim.snapshot(noise=False).node("gpu-node-01").gpus[0].temperature_c)
    assert all(b >= a for a, b in itertools.pairwise(trace))  # monotonic heating
    loaded = trace[-1]
    assert 60.0 < loaded < 75.0
    rise_63 = idle + 0.63 * (loaded - idle)
    t_63 = 5.0 * next(i + 1 for i, x in enumerate(trace) if x >= rise_63)
    assert 20.0 <= t_63 <= 90.0
    sim.run_until(900)
    assert max(temps(sim.snapshot(noise=False))) < idle + 2.0


def test_steady_state_matches_the_analytic_solution() -> None:
    sim = RackSimulator(scenario([full_load()]))
    start = sim.snapshot(noise=False)
    sim.run_until(900)
    snap = sim.snapshot(noise=False)
    # Started at steady state: nothing drifts.
    assert max(abs(a - b) for a, b in zip(temps(start), temps(snap), strict=True)) < 0.05
    r = thermal.R_PLATE_K_PER_W + thermal.R_CONV_NOMINAL_K_PER_W
    r_air = thermal.R_AIR_K_PER_W
    inlet = snap.inlet_c["middle"]
    for node in snap.nodes:
        for g in node.gpus:
            assert g.power_w == pytest.approx(H100_SXM.power_limit_w)
            t_node = snap.cdu.return_c  # equal loads: every node outlet is the return
            analytic = (g.power_w + t_node / r + inlet / r_air) / (1 / r + 1 / r_air)
            assert g.temperature_c == pytest.approx(analytic, abs=1.2)
    # Loop energy balance: the coolant carries most (not all: some goes to air) GPU heat.
    mcp = snap.cdu.flow_lpm / 60 * thermal.COOLANT_KG_PER_L * thermal.COOLANT_CP_J_PER_KG_K
    gpu_heat = sum(g.power_w for n in snap.nodes for g in n.gpus)
    carried = mcp * (snap.cdu.return_c - snap.cdu.supply_c)
    assert 0.85 * gpu_heat < carried < gpu_heat


def test_throttling_sets_clock_reasons_then_the_gpu_is_lost_for_good() -> None:
    degrade = {"at_s": 10, "kind": "cold_plate_degrade", "target": "gpu-node-01", "gpu": 2}
    sim = RackSimulator(scenario([full_load(), {**degrade, "factor": 8.0, "ramp_s": 60}]))
    seen_sw = seen_hw = False
    while sim.t < 600:
        sim.step(1.0)
        g = sim.snapshot(noise=False).node("gpu-node-01").gpus[2]
        if g.lost:
            break
        if g.temperature_c >= SLOWDOWN:
            assert g.clock_event_reasons & pynvml.nvmlClocksEventReasonSwThermalSlowdown
            assert g.power_w < H100_SXM.power_limit_w
            seen_sw = True
        if g.clock_event_reasons & pynvml.nvmlClocksEventReasonHwThermalSlowdown:
            assert g.clock_event_reasons & pynvml.nvmlClocksEventReasonHwSlowdown
            assert g.temperature_c >= H100_SXM.shutdown_c - 1
            seen_hw = True
        if g.temperature_c < SLOWDOWN:
            assert g.clock_event_reasons & pynvml.nvmlClocksEventReasonSwPowerCap
    assert seen_sw and seen_hw
    sim.inject("cold_plate_repair", "gpu-node-01", gpu=2)
    sim.run_until(1200)
    g = sim.snapshot(noise=False).node("gpu-node-01").gpus[2]
    assert g.lost and g.power_w == 0.0 and g.utilization == 0.0
    assert g.temperature_c < 60.0  # it cooled down, but stays off the bus


def test_power_cap_idle_and_utilization() -> None:
    sim = RackSimulator(
        scenario(
            [
                full_load(0, util=0.5),
                {"at_s": 0, "kind": "job_start", "target": "gpu-node-02", "util": 1.0},
                {"at_s": 0, "kind": "power_cap", "target": "gpu-node-02", "limit_w": 400},
            ]
        )
    )
    snap = sim.snapshot(noise=False)
    half = snap.node("gpu-node-01").gpus[0]
    assert half.utilization == 50.0
    assert half.power_w == pytest.approx(68 + 0.5 * (700 - 68))
    assert half.clock_event_reasons == 0
    capped = snap.node("gpu-node-02").gpus[0]
    assert capped.power_w == 400.0 and capped.power_limit_w == 400.0
    assert capped.clock_event_reasons == pynvml.nvmlClocksEventReasonSwPowerCap
    assert "power_cap:gpu-node-02" in snap.events_active
    sim.inject("job_stop", "gpu-node-03")
    sim.step(1.0)
    idle = sim.snapshot(noise=False).node("gpu-node-03").gpus[0]
    assert idle.power_w == H100_SXM.idle_power_w and idle.utilization == 0.0
    assert idle.clock_event_reasons == pynvml.nvmlClocksEventReasonGpuIdle
    with pytest.raises(ScenarioError, match="target"):
        sim.inject("job_stop", "gpu-node-99")


def test_memory_temperature_tracks_the_die_with_a_lag() -> None:
    sim = RackSimulator(scenario([full_load(30)]))
    g0 = sim.snapshot(noise=False).nodes[0].gpus[0]
    assert g0.memory_temperature_c == pytest.approx(g0.temperature_c + thermal.MEM_OFFSET_C)
    sim.run_until(60)
    g = sim.snapshot(noise=False).nodes[0].gpus[0]
    assert g.memory_temperature_c < g.temperature_c  # lagging behind a rising die
    sim.run_until(900)
    g = sim.snapshot(noise=False).nodes[0].gpus[0]
    assert g.memory_temperature_c == pytest.approx(g.temperature_c + thermal.MEM_OFFSET_C, abs=0.1)


def test_pump_failure_cdu_telemetry_and_leak() -> None:
    sim = RackSimulator(
        scenario(
            [
                full_load(0, 0.9),
                {"at_s": 60, "kind": "pump_fail"},
                {"at_s": 300, "kind": "leak"},
                {"at_s": 400, "kind": "pump_restore"},
            ]
        )
    )
    healthy = sim.snapshot(noise=False).cdu
    assert healthy.pump_running and not healthy.alarm and not healthy.leak
    assert healthy.flow_lpm == 40.0 and healthy.differential_pressure_kpa > 100
    assert 5.0 < healthy.return_c - healthy.supply_c < 12.0
    sim.run_until(70)
    failed = sim.snapshot(noise=False).cdu
    assert not failed.pump_running and failed.pump_speed_pct == 0.0 and failed.alarm
    assert failed.flow_lpm < 0.1 * healthy.flow_lpm
    assert failed.differential_pressure_kpa < 0.01 * healthy.differential_pressure_kpa
    sim.run_until(180)
    assert sim.snapshot(noise=False).cdu.supply_c > healthy.supply_c + 5.0
    sim.run_until(310)
    snap = sim.snapshot(noise=False)
    assert snap.cdu.leak and "leak" in snap.events_active and "pump_fail" in snap.events_active
    sim.run_until(460)
    restored = sim.snapshot(noise=False).cdu
    assert restored.pump_running and restored.flow_lpm > 0.95 * healthy.flow_lpm
    assert restored.alarm  # the leak is still there


def test_inlet_gradient_and_pdu_phases() -> None:
    sim = RackSimulator(scenario([full_load(0, 0.9)]))
    snap = sim.snapshot(noise=False)
    assert list(snap.inlet_c) == ["bottom", "middle", "top"]
    assert snap.inlet_c["bottom"] < snap.inlet_c["middle"] < snap.inlet_c["top"]
    assert snap.inlet_c["bottom"] == pytest.approx(22.0)
    nodes_w = sum(n.power_w for n in snap.nodes)
    gpus_w = sum(g.power_w for n in snap.nodes for g in n.gpus)
    assert nodes_w == pytest.approx(gpus_w + 4 * 2000.0)
    assert sum(snap.pdu_power_w.values()) == pytest.approx(nodes_w)
    assert sorted(snap.pdu_power_w) == ["L1", "L2", "L3"]
    for phase, watts in snap.pdu_power_w.items():
        assert snap.pdu_current_a[phase] == pytest.approx(watts / 230.0)
        assert watts == pytest.approx(nodes_w / 3, rel=0.1)


# -- the shipped scenarios ---------------------------------------------------------------


def test_the_shipped_scenarios_load_by_name() -> None:
    assert set(list_scenarios()) >= SHIPPED
    for name in list_scenarios():
        sc = load_scenario(name)
        assert sc.name == name
        assert len(sc.description) > 80  # the timeline is documented
        assert sc.rack.nodes == tuple(NODES) and sc.rack.gpus_per_node == 8


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_scenario_meets_its_own_expectations(name: str) -> None:
    run = run_scenario(name)
    expect = run.scenario.expect
    # Ground truth is consistent: every node whose GPUs cross is to be drained (facility
    # limits and a loop without flow drain nodes whose GPUs never cross, too).
    assert set(run.crossers) <= set(expect.drained_nodes)
    if expect.first_crossing is None:
        assert run.first_crossing is None
    else:
        assert run.first_crossing is not None
        t, node, gpu = run.first_crossing
        lo, hi = expect.first_crossing.window_s
        assert lo <= t <= hi
        assert expect.first_crossing.node in (None, node)
        assert expect.first_crossing.gpu in (None, gpu)
    if expect.min_margin_c is not None:
        assert run.peak_c <= SLOWDOWN - expect.min_margin_c
    if expect.final_max_c is not None:
        assert run.final is not None
        live = [g.temperature_c for n in run.final.nodes for g in n.gpus if not g.lost]
        assert len(live) == 32 and max(live) <= expect.final_max_c


def test_normal_load_keeps_a_10c_margin_while_jobs_start_and_stop() -> None:
    run = run_scenario("normal-load")
    assert 55.0 < run.peak_c <= SLOWDOWN - 10.0  # it did get loaded
    assert all(e.kind in (EventKind.JOB_START, EventKind.JOB_STOP) for e in run.scenario.events)


def test_hot_gpu_crosses_only_on_node_02_gpu_3_after_five_minutes() -> None:
    run = run_scenario("hot-gpu")
    assert run.crossers == {"gpu-node-02": {3}}
    assert run.first_crossing is not None
    t, _, _ = run.first_crossing
    assert t - onset(run.scenario, EventKind.COLD_PLATE_DEGRADE) >= 300.0
    assert run.peak_c < H100_SXM.shutdown_c  # throttled, not lost
    assert run.final is not None
    assert run.final.node("gpu-node-02").gpus[3].temperature_c < 70.0  # repaired


def test_pump_failure_crosses_within_seconds_to_minutes_on_every_node() -> None:
    run = run_scenario("pump-failure")
    assert run.first_crossing is not None
    delay = run.first_crossing[0] - onset(run.scenario, EventKind.PUMP_FAIL)
    assert 30.0 <= delay <= 180.0
    assert set(run.crossers) == set(NODES)


def test_chiller_loss_crosses_slowly() -> None:
    run = run_scenario("chiller-loss")
    assert run.first_crossing is not None
    delay = run.first_crossing[0] - onset(run.scenario, EventKind.CHILLER_FAIL)
    assert 600.0 <= delay <= 1800.0
    assert set(run.crossers) == set(NODES)


def test_crac_loss_heats_the_inlet_not_the_gpus() -> None:
    sc = load_scenario("crac-loss")
    sim = RackSimulator(sc)
    before = sim.snapshot(noise=False)
    sim.run_until(onset(sc, EventKind.CRAC_RESTORE) - 1)
    hot = sim.snapshot(noise=False)
    assert hot.inlet_c["top"] - before.inlet_c["top"] >= 10.0
    assert hot.inlet_c["bottom"] < hot.inlet_c["middle"] < hot.inlet_c["top"]
    assert max(temps(hot)) - max(temps(before)) < 2.0
    assert sum(hot.pdu_power_w.values()) > 1.05 * sum(before.pdu_power_w.values())  # fans
    assert "crac_fail" in hot.events_active
    sim.run_until(sc.duration_s)
    assert sim.snapshot(noise=False).inlet_c["top"] < hot.inlet_c["top"] - 5.0


def test_sensor_dropout_flags_only_that_gpu_for_its_duration() -> None:
    run = run_scenario("sensor-dropout")
    assert set(run.dropped) == {("gpu-node-03", 5)}
    seconds = run.dropped[("gpu-node-03", 5)]
    assert seconds == [float(t) for t in (*range(120, 210), *range(400, 420))]
    assert run.peak_c < SLOWDOWN - 10.0


def test_recovery_returns_to_normal() -> None:
    run = run_scenario("recovery")
    assert run.peak_c >= SLOWDOWN  # a loaded rack's 40 s pump stop reaches slowdown
    assert run.final is not None
    assert max(temps(run.final)) < 75.0  # back near 71 C on the 34 C warm-water loop
    assert not any(g.lost for n in run.final.nodes for g in n.gpus)
    assert run.final.cdu.pump_running and not run.final.cdu.alarm


# -- the NVML bridge ---------------------------------------------------------------------


def test_bridge_sets_and_clears_the_temperature_error_on_dropout() -> None:
    rack = SimulatedRack("sensor-dropout", seed=1)
    fake = rack.gpus_by_node["gpu-node-03"][5]
    other = rack.gpus_by_node["gpu-node-03"][4]
    other.errors["nvmlDeviceGetTemperature"] = pynvml.NVML_ERROR_TIMEOUT  # set by a test
    rack.advance(100.0)
    assert "nvmlDeviceGetTemperature" not in fake.errors
    snap = rack.advance(30.0)
    assert snap.node("gpu-node-03").gpus[5].dropped_out
    assert fake.errors == {"nvmlDeviceGetTemperature": pynvml.NVML_ERROR_UNKNOWN}
    assert rack.snapshot is snap and rack.t == 130.0
    rack.advance(100.0)
    assert fake.errors == {}
    assert other.errors == {"nvmlDeviceGetTemperature": pynvml.NVML_ERROR_TIMEOUT}


def test_bridge_copies_values_and_marks_lost_gpus() -> None:
    rack = SimulatedRack(load_scenario("pump-failure"))
    snap = rack.snapshot
    node = snap.node("gpu-node-02")
    fakes = rack.gpus_by_node["gpu-node-02"]
    assert [f.uuid for f in fakes] != [f.uuid for f in rack.gpus_by_node["gpu-node-01"]]
    for g, f in zip(node.gpus, fakes, strict=True):
        assert f.temperature_c == g.temperature_c
        assert f.memory_temperature_c == g.memory_temperature_c
        assert f.power_w == g.power_w and f.power_limit_w == g.power_limit_w
        assert f.clock_event_reasons == g.clock_event_reasons
        assert not f.lost
    rack.advance(rack.scenario.duration_s)
    assert all(f.lost for gpus in rack.gpus_by_node.values() for f in gpus)
    with pytest.raises(ValueError, match="gpu-node-02"):
        apply_node(node, fakes[:7])


# -- the loader --------------------------------------------------------------------------

GOOD = """
name = "t"
description = "d"
duration_s = 600

[rack]
nodes = ["a", "b"]

[[events]]
at_s = 10
kind = "cold_plate_degrade"
target = "a"
gpu = 1
factor = 2.0

[expect]
drained_nodes = ["a"]
"""


def load_text(tmp_path: Path, text: str) -> Scenario:
    path = tmp_path / "case.toml"
    path.write_text(text)
    return load_scenario(str(path))


def test_loader_fills_defaults(tmp_path: Path) -> None:
    sc = load_text(tmp_path, GOOD)
    assert sc.rack.gpus_per_node == 8 and sc.rack.probes == ("bottom", "middle", "top")
    (ev,) = sc.events
    assert ev.kind is EventKind.COLD_PLATE_DEGRADE and ev.gpu == 1
    assert dict(ev.params) == {"factor": 2.0, "ramp_s": 0.0}
    assert sc.expect.drains == 1 and sc.expect.first_crossing is None


@pytest.mark.parametrize(
    ("edit", "key", "problem"),
    [
        (("duration_s = 600", "duration_s = 600\ncolour = 1"), "colour", "unknown key"),
        (("factor = 2.0", "factor = 2.0\nfactr = 3"), r"events\[0\]\.factr", "unknown key"),
        (('nodes = ["a", "b"]', 'nodes = ["a", "b"]\nfans = 2'), r"rack\.fans", "unknown key"),
        (("factor = 2.0", ""), r"events\[0\]\.factor", "required key is missing"),
        (('nodes = ["a", "b"]', ""), r"rack\.nodes", "required key is missing"),
        (('description = "d"', ""), "description", "required key is missing"),
        (("duration_s = 600", 'duration_s = "600"'), "duration_s", "must be a number"),
        (("gpu = 1", "gpu = 1.5"), r"events\[0\]\.gpu", "must be an integer"),
        (("gpu = 1", "gpu = 8"), r"events\[0\]\.gpu", "gpus_per_node"),
        (('target = "a"', 'target = "z"'), r"events\[0\]\.target", "must be"),
        (('kind = "cold_plate_degrade"', 'kind = "meltdown"'), r"events\[0\]\.kind", "unknown"),
        (("at_s = 10", "at_s = 900"), r"events\[0\]\.at_s", "after the end"),
        (("factor = 2.0", "factor = 0.5"), r"events\[0\]\.factor", "at least 1"),
        (('drained_nodes = ["a"]', 'drained_nodes = ["q"]'), r"expect\.drained_nodes", "'q'"),
        (('drained_nodes = ["a"]', "drains = 2"), r"expect\.drains", "is 2"),
        (("[rack]", '[rack]\ngpu_model = "b200"'), r"rack\.gpu_model", "unknown GPU model"),
        (
            ('drained_nodes = ["a"]', 'drained_nodes = ["a"]\nfirst_crossing = { window_s = [5] }'),
            r"expect\.first_crossing\.window_s",
            "earliest, latest",
        ),
    ],
)
def test_loader_errors_name_the_key(
    tmp_path: Path, edit: tuple[str, str], key: str, problem: str
) -> None:
    old, new = edit
    assert old in GOOD
    with pytest.raises(ScenarioError, match=rf"^case\.toml: {key}: .*{problem}"):
        load_text(tmp_path, GOOD.replace(old, new, 1))


def test_loader_rejects_bad_toml_and_unknown_names(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match=r"case\.toml: not valid TOML"):
        load_text(tmp_path, "name = ")
    with pytest.raises(ScenarioError, match=r"no such scenario.*hot-gpu"):
        load_scenario("no-such-scenario")


# -- speed ---------------------------------------------------------------------------------


def test_thirty_minutes_of_a_4x8_rack_is_fast() -> None:
    sim = RackSimulator(scenario([full_load(0, 0.9)], duration_s=1800))
    start = time.process_time()
    while sim.t < 1800:
        sim.step(1.0)
        sim.snapshot()
    cpu = time.process_time() - start
    print(f"30 simulated minutes, 4x8 GPUs, a snapshot per second: {cpu:.3f} s CPU")
    assert cpu < 10.0
