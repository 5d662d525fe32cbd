"""The inlet rung of the cap ladder: GPU power derated between the inlet limit (A1) and the
site's rated ``inlet_derate_limit_c``, closed loop on the simulator (bench/cap_scoring.py)."""

from __future__ import annotations

import functools
import itertools
from dataclasses import replace

import msgspec
import pytest

from bench.cap_scoring import Hooks, LadderRun, ladder_scenario, run_ladder
from fakes.sim.scenario import Scenario, parse_scenario
from fakes.sim.thermal import RackSimulator
from policies.model import Reading, SensorKind
from policies.power_cap import REFUSED_RETRY_MAX_S, REFUSED_RETRY_S, CapDecision, CapSettings
from policies.settings import PolicySettings, RackLimits

A3 = PolicySettings(inlet_derate_limit_c=40.0)  # a site rated A3 with derating
NODES = ("gpu-node-01", "gpu-node-02", "gpu-node-03", "gpu-node-04")
A1_DRAIN = "inlet air of rack-sim nearing its limit"
A1_EXCLUDE = "inlet air of rack-sim at or above its limit"
DERATE_DRAIN = "inlet air of rack-sim nearing its derate limit"


def crac(max_rise_c: float, *, restore_at: float | None = None, duration_s: int = 2400) -> Scenario:
    """The room warming 0.4 C/min from t=300 (top inlet ~24.5 C) by ``max_rise_c``; the
    inlet limit (32 C) is forecast within twice the drain horizon from t~500."""
    events: list[dict[str, object]] = [
        {"at_s": 0, "kind": "job_start", "target": "rack", "util": 0.9},
        {
            "at_s": 300,
            "kind": "crac_fail",
            "target": "rack",
            "rate_c_per_min": 0.4,
            "max_rise_c": max_rise_c,
        },
    ]
    if not max_rise_c:
        events.pop()  # the room steady
    if restore_at is not None:
        events.append({"at_s": restore_at, "kind": "crac_restore", "target": "rack"})
    return parse_scenario(
        {
            "name": f"crac-{max_rise_c:g}",
            "description": "The room warms past the A1 allowable.",
            "duration_s": duration_s,
            "seed": 37,
            "rack": {"nodes": list(NODES), "probes": ["bottom", "middle", "top"]},
            "events": events,
            "expect": {"drained_nodes": []},
        }
    )


@functools.cache
def drain_only(max_rise_c: float) -> LadderRun:
    return run_ladder(crac(max_rise_c), A3, caps=False)


def caps_of(run: LadderRun) -> list[tuple[float, int]]:
    """gpu-node-01 gpu0's caps: (time, watts)."""
    return [
        (t, int(line.rsplit(" ", 1)[1].removesuffix("W")))
        for t, line in run.log
        if line.startswith("gpu-node-01 gpu0: cap ")
    ]


def outs(run: LadderRun, words: str) -> list[float]:
    return [t for t, line in run.log if words in line and ": cap " not in line]


def test_power_cap_derate_crac_slow_bench_row() -> None:
    """crac-slow as bench scores it (site rated A2 with derating, both runs): no GPU at
    slowdown, far less given up than drain-only, which drains and excludes at A1. The
    top inlet ends at ~33 C, short of 35 C: the derate limit's forecast drains the rack
    in the run's last minute."""
    sc, s = ladder_scenario("crac-slow", PolicySettings())
    assert s.inlet_derate_limit_c == 35.0
    base = run_ladder(sc, s, caps=False)
    run = run_ladder(sc, s, caps=True)
    assert base.slowdown_gpu_s == 0 and run.slowdown_gpu_s == 0
    assert outs(base, A1_DRAIN) and outs(base, A1_EXCLUDE)
    assert not outs(run, A1_DRAIN) and not outs(run, A1_EXCLUDE)
    assert run.given_up_gpu_s < base.given_up_gpu_s / 5
    assert len(run.capped_gpus) == 32
    assert min(t for t, _ in caps_of(run)) < min(base.first_out.values())


def test_power_cap_derate_caps_between_the_limits_instead_of_draining() -> None:
    """Top inlet to ~33.5 C and back: drain-only drains and excludes at the A1 limit; with
    the derate the GPUs run derated in steps, nobody is drained, and the limit comes back
    in steps only once the air is 2 C under the limit and no longer warming."""
    sc = crac(9, restore_at=1800)
    base = run_ladder(sc, A3, caps=False)
    run = run_ladder(sc, A3, caps=True)
    assert outs(base, A1_DRAIN) and outs(base, A1_EXCLUDE)
    assert run.first_out == {}
    assert len(run.capped_gpus) == 32
    assert run.slowdown_gpu_s == 0
    caps = caps_of(run)
    # Derated before the A1 drain would have gone ahead, one step at a time, never under
    # the minimum: 600 W ahead of the limit, 500 W above it (the top reaches ~33.5 C).
    assert caps[0][0] < min(base.first_out.values())
    assert [w for _, w in caps] == [600, 500]
    assert run.given_up_gpu_s < base.given_up_gpu_s / 10
    restores = [(t, line) for t, line in run.log if line.startswith("gpu-node-01 gpu0: restore")]
    assert [line.rsplit(" ", 1)[1] for _, line in restores] == ["600W", "700W"]
    # The room is back under 30 C ~90 s after the CRAC restore (tau 180 s): then the
    # undo waits healthy_after_s (120 s) of settled air before the first step.
    assert restores[0][0] >= 1800 + 90 + CapSettings().healthy_after_s
    assert not [t for t, line in run.log if ": cap " in line and t > restores[0][0]]


def test_power_cap_derate_drains_at_the_derate_limit() -> None:
    """Top inlet past 40 C: the derate holds the rack in service past the A1 limit, down to
    the minimum; the rack drains on the derate limit's forecast and is excluded there."""
    sc = crac(16, duration_s=2700)
    base = run_ladder(sc, A3, caps=False)
    run = run_ladder(sc, A3, caps=True)
    assert not outs(run, A1_DRAIN) and not outs(run, A1_EXCLUDE)
    drains = outs(run, DERATE_DRAIN)
    assert len(drains) == len(NODES) and min(drains) > min(base.first_out.values()) + 600
    assert outs(run, "inlet air of rack-sim at or above its derate limit")
    assert [w for _, w in caps_of(run)] == [600, 500, 400, 300, 200]
    assert run.slowdown_gpu_s == 0
    assert run.given_up_gpu_s < base.given_up_gpu_s


def _drains_as_drain_only(run: LadderRun, max_rise_c: float) -> None:
    base = drain_only(max_rise_c)
    assert run.first_out == pytest.approx(base.first_out, abs=5.0)
    assert outs(run, A1_DRAIN) and not outs(run, DERATE_DRAIN)


def test_power_cap_derate_refused_caps_drain_at_the_inlet_limit() -> None:
    """NVML_ERROR_NO_PERMISSION on every set: the ladder forgets each cap (as the applier
    does), nothing is enforced, and the rack drains at A1 exactly as drain-only."""
    refused = Hooks(apply=lambda _t, _c: False)
    run = run_ladder(crac(9), A3, caps=True, hooks=refused)
    _drains_as_drain_only(run, 9)
    # Asked again after a backoff (10 s doubling to 5 min), not at every evaluation.
    asks = [t for t, _ in caps_of(run)]
    gaps = [b - a for a, b in itertools.pairwise(asks)]
    assert len(asks) >= 3 and gaps[0] >= REFUSED_RETRY_S
    assert all(later >= earlier for earlier, later in itertools.pairwise(gaps))
    assert max(gaps) >= REFUSED_RETRY_MAX_S


@pytest.mark.parametrize(
    "cap_settings", [CapSettings(storm_nodes=0), CapSettings(budget_w=50.0)], ids=str
)
def test_power_cap_derate_withheld_by_the_fleet_limits_drains_at_the_inlet_limit(
    cap_settings: CapSettings,
) -> None:
    run = run_ladder(crac(9), A3, caps=True, cap_settings=cap_settings)
    assert run.capped_gpus == set()
    _drains_as_drain_only(run, 9)


def test_power_cap_derate_in_dry_run_drains_at_the_inlet_limit() -> None:
    """dry_run: the derate is decided and shown, never enforced: no drain is deferred."""
    run = run_ladder(crac(9), replace(A3, dry_run=True), caps=True)
    assert len(run.capped_gpus) == 32  # decided (recorded), not applied
    _drains_as_drain_only(run, 9)


def test_power_cap_derate_against_another_actors_limit_drains_at_the_inlet_limit() -> None:
    """A tool that pins every GPU at 650 W: rackguard's derate never reads back as enforced
    (released as another actor's), so the A1 drain is never deferred."""

    def pin(t: float, sim: RackSimulator) -> None:
        if t >= 400:
            sim.inject("power_cap", "rack", limit_w=650.0)

    run = run_ladder(crac(9), A3, caps=True, hooks=Hooks(step=pin))
    assert any("release" in line for _, line in run.log)
    _drains_as_drain_only(run, 9)


def test_power_cap_derate_ignores_a_one_sample_inlet_glitch() -> None:
    """Every probe reading 34 C for one sample (the room steady at ~24.5 C) caps nothing
    and drains nothing: the level is held over two samples. Two such samples in a row
    are a step of the air: derated, and excluded at the inlet limit, since the derate
    was not yet enforced when the limit was reached."""

    def glitch(times: set[float]) -> Hooks:
        def tamper(t: float, readings: list[Reading]) -> list[Reading]:
            if t not in times:
                return readings
            inlet = SensorKind.INLET_TEMPERATURE
            return [
                msgspec.structs.replace(r, value=34.0) if r.kind is inlet else r for r in readings
            ]

        return Hooks(readings=tamper)

    sc = crac(0, duration_s=900)
    once = run_ladder(sc, A3, caps=True, hooks=glitch({600.0}))
    assert once.capped_gpus == set() and once.first_out == {}
    twice = run_ladder(sc, A3, caps=True, hooks=glitch({600.0, 605.0}))
    assert len(twice.capped_gpus) == 32
    assert min(outs(twice, A1_EXCLUDE)) == 605.0


def test_power_cap_derate_limit_is_validated_naming_the_key() -> None:
    problems = dict(PolicySettings(inlet_derate_limit_c=32.0).validate())
    assert problems == {"inlet_derate_limit_c": "must be above inlet_limit_c (32.0), got 32.0"}
    rack = RackLimits(inlet_limit_c=40.0)
    problems = dict(replace(A3, racks={"r1": rack}).validate())
    assert "racks.r1.inlet_limit_c" in problems
    rack = RackLimits(inlet_derate_limit_c=30.0)
    assert "racks.r1.inlet_derate_limit_c" in dict(replace(A3, racks={"r1": rack}).validate())
    assert A3.inlet_derate_limit("r1") == 40.0 and PolicySettings().inlet_derate_limit("r") is None


def test_power_cap_derate_decision_names_the_inlet_and_both_limits() -> None:
    seen: list[CapDecision] = []

    def keep(_t: float, c: CapDecision) -> bool:
        seen.append(c)
        return True

    run_ladder(crac(9), A3, caps=True, hooks=Hooks(apply=keep))
    first = seen[0].reason
    assert first.startswith("rackguard: inlet air of rack-sim ")
    assert "forecast to reach its limit 32C" in first and "derate limit 40C" in first
    assert "derated to 600W" in first
    over = next(c.reason for c in seen if c.watts == 500.0)
    assert "at or above its limit 32C" in over


def test_power_cap_derate_restart_mid_derate_neither_doubles_nor_forgets() -> None:
    """A restart at t=1000 s with the derate's rows carried (the decision store): not capped
    again from the derated limit, still deferring the A1 drain, and restored after."""
    run = run_ladder(
        crac(9, restore_at=1800),
        A3,
        caps=True,
        restart_at=1000.0,
        carry=lambda p: list(p.caps.states.values()) if p.caps else [],
    )
    assert run.first_out == {}
    assert [w for _, w in caps_of(run)] == [600, 500]
    restores = [line for _, line in run.log if line.startswith("gpu-node-01 gpu0: restore")]
    assert restores and restores[-1].endswith("restore 700W")
