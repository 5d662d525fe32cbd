"""The cap rung of the ladder, closed loop on the simulator (bench/cap_scoring.py)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from types import MappingProxyType

import pytest

from bench.cap_scoring import run_ladder, synchronized_job_start
from fakes.sim.scenario import parse_scenario
from policies.model import Quality, Reading, SensorKind
from policies.policy import Policy
from policies.power_cap import CapAction, CapLadder, CapSettings, CapState
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
