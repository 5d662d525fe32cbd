"""The cap rung of the ladder, closed loop on the simulator (bench/cap_scoring.py)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from types import MappingProxyType

import pytest

from bench.cap_scoring import run_ladder, supply_drift_warm_water, synchronized_job_start
from fakes.sim.scenario import parse_scenario
from policies.gpu import GpuView
from policies.model import Condition, FaultDomain, Quality, Reading, SensorKind
from policies.policy import Policy, held_by_cap
from policies.power_cap import CapAction, CapLadder, CapSettings, CapState
from policies.rules import Verdict
from policies.safety import ClusterLedger
from policies.settings import PolicySettings

S = PolicySettings()


def test_power_cap_holds_the_hot_gpu_instead_of_draining() -> None:
    drain_only = run_ladder("hot-gpu", S, caps=False)
    capped = run_ladder("hot-gpu", S, caps=True)
    assert drain_only.first_out == {"gpu-node-02": pytest.approx(230.0, abs=30)}
    assert drain_only.slowdown_gpu_s > 100
    assert capped.capped_gpus == {"gpu-node-02/gpu3"}
    assert capped.first_out == {}  # the cap held: no drain
    assert capped.slowdown_gpu_s == 0
    assert capped.given_up_gpu_s < drain_only.given_up_gpu_s / 20
    restores = [t for t, line in capped.log if "restore" in line]
    assert restores and min(restores) > 720  # only after the plate was repaired


@pytest.mark.parametrize("name", ["pump-failure", "pump-failure-cdu-silent"])
def test_power_cap_loop_failure_caps_every_gpu_to_minimum_then_drains(name: str) -> None:
    drain_only = run_ladder(name, S, caps=False)
    capped = run_ladder(name, S, caps=True)
    assert len(capped.capped_gpus) == 32
    caps = [(t, line) for t, line in capped.log if ": cap " in line]
    assert all(line.endswith("cap 200W") for _, line in caps)
    first_cap = min(t for t, _ in caps)
    assert first_cap <= 180 + 10  # within ~10 s of the pump stopping
    # The cap is the first rung, not a replacement: every node is still drained.
    assert set(capped.first_out) == set(drain_only.first_out)
    assert all(first_cap <= t for t in capped.first_out.values())
    was = drain_only.to_slowdown_s
    assert was is not None
    stretched = capped.to_slowdown_s
    assert stretched is None or stretched >= 2.5 * was


def test_power_cap_no_false_caps_on_a_synchronized_job_start() -> None:
    sc = synchronized_job_start()
    run = run_ladder(sc, S, caps=True)
    assert run.capped_gpus == set()
    assert run.first_out == {}


@pytest.mark.parametrize("carried", [True, False])
def test_power_cap_restart_mid_cap_neither_doubles_nor_forgets(carried: bool) -> None:
    run = run_ladder(
        "hot-gpu",
        S,
        caps=True,
        restart_at=600.0,
        carry=(lambda p: list(p.caps.states.values()) if p.caps else []) if carried else None,
    )
    after = [(t, line) for t, line in run.log if t >= 600.0]
    if carried:
        # Known as rackguard's own: not capped again at the restart, restored after repair.
        assert not [line for t, line in after if t < 620.0 and ": cap " in line]
        assert any("restore" in line for _, line in after)
    else:
        # Forgotten: nothing ever restores it (what the decision store's rows prevent).
        assert not any("restore" in line for _, line in after)


def _reading(sensor: str, kind: SensorKind, value: float, t: float) -> Reading:
    labels = MappingProxyType({"node": "n1", "gpu": "0"})
    unit = "watts" if "power" in sensor else "celsius"
    return Reading("gpus", f"gpu0.{sensor}", kind, value, unit, Quality.GOOD, t, t, labels=labels)


def _policy_at(limit_w: float, t: float) -> Policy:
    policy = Policy(S, {"r1": ("n1",)})
    policy.caps = CapLadder(CapSettings())
    policy.caps.observe_limit("n1", "0", 200.0, 700.0)
    policy.observe(
        [
            _reading("temperature", SensorKind.GPU_TEMPERATURE, 60.0, t),
            _reading("slowdown_threshold", SensorKind.GPU_SLOWDOWN_THRESHOLD, 90.0, t),
            _reading("power", SensorKind.GPU_POWER, 300.0, t),
            _reading("power_limit", SensorKind.GPU_POWER_LIMIT, limit_w, t),
        ]
    )
    return policy


def test_power_cap_changed_by_another_actor_is_released_not_overwritten() -> None:
    policy = _policy_at(450.0, 10.0)  # an admin set 450 W over rackguard's 400 W
    assert policy.caps is not None
    policy.caps.restore(CapState("n1", "0", 400.0, 700.0, 0.0, "margin"))
    policy.evaluate(10.0, 10.0, ClusterLedger({"r1": ("n1",)}, 600.0).view(10.0))
    [d] = policy.cap_decisions
    assert d.action is CapAction.RELEASE and d.watts == 450.0
    assert "not rackguard's" in d.reason
    assert policy.caps.states == {}


def test_power_cap_own_cap_is_carried_on_not_capped_again() -> None:
    policy = _policy_at(400.0, 10.0)
    assert policy.caps is not None
    policy.caps.restore(CapState("n1", "0", 400.0, 650.0, 0.0, "margin"))
    policy.evaluate(10.0, 10.0, ClusterLedger({"r1": ("n1",)}, 600.0).view(10.0))
    assert policy.cap_decisions == []  # its own: neither released nor capped again
    assert policy.caps.states[("n1", "0")].limit_w == 400.0


def test_power_cap_storm_withholds_new_caps_beyond_the_node_count() -> None:
    ladder = CapLadder(CapSettings(storm_nodes=1))
    ladder._capped_at.append((0.0, "other-node"))
    assert ladder._withheld("n1", None, 100.0).startswith("cap storm")
    assert ladder._withheld("other-node", None, 100.0) == ""
    budget = CapLadder(CapSettings(budget_w=150.0))
    budget.restore(CapState("n2", "1", 600.0, 700.0, 0.0, "margin"))
    assert budget._withheld("n1", None, 100.0).startswith("cap budget")


def test_power_cap_dry_run_cap_never_enforced_is_not_another_actors() -> None:
    policy = _policy_at(700.0, 10.0)  # the dry cap of 400 W was only recorded
    assert policy.caps is not None
    policy.caps.dry_run = True
    policy.caps.restore(CapState("n1", "0", 400.0, 700.0, 0.0, "margin"))
    policy.evaluate(10.0, 10.0, ClusterLedger({"r1": ("n1",)}, 600.0).view(10.0))
    assert policy.cap_decisions == []
    assert ("n1", "0") in policy.caps.states


def test_power_cap_the_whole_ladder_when_the_cap_cannot_hold() -> None:
    """A plate failing to 14x: cap, drain, minimum cap, exclude; after the repair the
    limit restored in steps to what it was, and the node resumed."""
    with (Path(__file__).parents[2] / "fakes" / "scenarios" / "hot-gpu.toml").open("rb") as f:
        data = tomllib.load(f)
    data.update(name="hot-gpu-severe", duration_s=1500)
    data["events"][1]["factor"] = 14.0
    data["events"][2]["at_s"] = 900
    drain_only = run_ladder(parse_scenario(data), S, caps=False)
    run = run_ladder(parse_scenario(data), S, caps=True)
    steps = [line.split(": ", 1)[1].split(" (")[0] for _, line in run.log]
    first = {s: min(t for t, line in run.log if s in line) for s in ("cap", "drain", "exclude")}
    assert first["cap"] <= first["drain"] < first["exclude"]
    assert "cap 200W" in steps  # escalated: the minimum, the most time it buys
    restores = [s for s in steps if s.startswith("restore")]
    assert restores[-1] == "restore 700W" and len(restores) >= 3  # in steps, to before
    assert steps[-1] == "resume"
    assert drain_only.first_slowdown_s is not None and run.first_slowdown_s is not None
    assert run.first_slowdown_s - drain_only.first_slowdown_s > 300  # minutes, not seconds


def test_power_cap_signature_needs_heating_in_proportion_to_power() -> None:
    from policies.power_cap import _common_cause  # noqa: PLC0415 - the rule's own helper

    assert _common_cause([0.6 / 700, 0.55 / 690, 0.2 / 250]) == 3  # one cause, ~ power
    assert _common_cause([0.6 / 700, 0.6 / 70]) == 1  # an idle GPU heating as fast: not it
    assert _common_cause([0.001]) == 1


def test_power_cap_slow_supply_rise_held_by_caps_until_the_loop_limit_drains() -> None:
    """A warm-water loop drifting up: drain-only drains on a GPU forecast (the loop named
    as the cause); the ladder caps every GPU instead and drains only when the loop's own
    limit is forecast, with no GPU at slowdown and no restore while the supply climbs."""
    sc, s = supply_drift_warm_water()
    drain_only = run_ladder(sc, s, caps=False)
    run = run_ladder(sc, s, caps=True)
    first = min(drain_only.first_out.values())
    [why] = [line for t, line in drain_only.log if t == first and "following" not in line]
    assert "near slowdown" in why and "cooling loop" in why
    assert len(run.capped_gpus) == 32
    assert run.slowdown_gpu_s == 0 and drain_only.slowdown_gpu_s > 0
    assert set(run.first_out) == set(sc.expect.drained_nodes)
    outs = [line for _, line in run.log if ": drain" in line]
    assert outs and all("coolant supply of rack-sim nearing its limit" in x for x in outs)
    assert min(run.first_out.values()) > first + 300  # the cap bought minutes of service
    assert run.given_up_gpu_s < drain_only.given_up_gpu_s
    # Restored only once the supply stopped rising (t=2040 s), and never capped again.
    restores = [t for t, line in run.log if "restore" in line]
    plateau = 120 + 16 / 0.5 * 60
    assert restores and min(restores) > plateau
    assert not [t for t, line in run.log if ": cap " in line and t > min(restores)]


def test_power_cap_crac_slow_inlet_allowable_drains_as_without_caps() -> None:
    """A room warming toward the A1 allowable at a site without inlet_derate_limit_c: the
    drain is the inlet limit's, which no GPU cap moves; the ladder neither caps nor holds
    it back (with a derate limit: tests/policies/test_power_cap_derate.py)."""
    run = run_ladder("crac-slow", S, caps=True)
    assert run.capped_gpus == set()
    assert set(run.first_out) == {"gpu-node-01", "gpu-node-02", "gpu-node-03", "gpu-node-04"}
    drains = [line for _, line in run.log if ": drain" in line]
    assert drains and all("inlet air of rack-sim nearing its limit" in x for x in drains)
    assert any("inlet air of rack-sim at or above its limit" in x for _, x in run.log)


def _view(margin: float, *, predicted: bool) -> GpuView:
    cond = Condition.WARNING if predicted or margin <= S.enter_margin_c else Condition.OK
    return GpuView("gpu0", 0.0, cond, S, 80.0, 90.0, margin, predicted=predicted, at_risk=predicted)


@pytest.mark.parametrize("domain", [FaultDomain.GPU, FaultDomain.RACK, FaultDomain.COOLING_LOOP])
def test_power_cap_holds_a_gpu_thermal_drain_whatever_the_named_cause(
    domain: FaultDomain,
) -> None:
    gpu = Verdict(Condition.WARNING, False, domain, "rackguard: gpu0 ...", gpu_thermal=True)
    held = held_by_cap(gpu, [_view(10.0, predicted=True)], frozenset({"gpu0"}), S)
    assert held.condition is Condition.OK
    # Not held: the GPU at the enter margin (the cap did not hold), or not capped.
    assert (
        held_by_cap(gpu, [_view(S.enter_margin_c, predicted=False)], frozenset({"gpu0"}), S) == gpu
    )
    assert held_by_cap(gpu, [_view(10.0, predicted=True)], frozenset(), S) == gpu


def test_power_cap_never_holds_a_facility_rule_or_a_followed_peer() -> None:
    views, held = [_view(10.0, predicted=True)], frozenset({"gpu0"})
    facility = Verdict(Condition.WARNING, False, FaultDomain.RACK, "rackguard: inlet air ...")
    assert held_by_cap(facility, views, held, S) == facility
    peer = Verdict(Condition.WARNING, False, FaultDomain.RACK, "x", "n2", gpu_thermal=True)
    assert held_by_cap(peer, views, held, S) == peer
