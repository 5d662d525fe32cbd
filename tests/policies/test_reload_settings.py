"""A reload that keeps the windows' shape: the trackers already made read the new settings too."""

from __future__ import annotations

import dataclasses

from policies.model import Quality, Reading, SensorKind
from policies.policy import Policy
from policies.settings import PolicySettings

RACKS = {"r1": ("n1",)}
GPU = {"node": "n1", "gpu": "0"}


def _gpu(kind: SensorKind, t: float, value: float) -> Reading:
    return Reading("gpus", f"gpu0.{kind.value}", kind, value, "x", Quality.GOOD, t, t, labels=GPU)


def _supply(t: float, value: float) -> Reading:
    kind = SensorKind.COOLANT_SUPPLY_TEMPERATURE
    return Reading("cdu", "supply", kind, value, "celsius", Quality.GOOD, t, t, labels=RACK)


RACK = {"rack": "r1"}


def _feed(policy: Policy, seconds: range) -> None:
    # Flat until 80 s, then heating at 1 C/s: windows of another width see other rates.
    for k in seconds:
        t = float(k)
        temp = 60.0 + max(0.0, t - 80.0)
        policy.observe(
            [
                _gpu(SensorKind.GPU_POWER_LIMIT, t, 700.0),
                _gpu(SensorKind.GPU_POWER, t, 400.0),
                _gpu(SensorKind.GPU_TEMPERATURE, t, temp),
            ]
        )


def test_a_changed_confirm_window_reaches_the_gpus_already_tracked() -> None:
    old = PolicySettings()
    new = dataclasses.replace(old, flow_loss_confirm_s=3 * old.flow_loss_confirm_s)
    reloaded, fresh, unchanged = Policy(old, RACKS), Policy(new, RACKS), Policy(old, RACKS)
    _feed(reloaded, range(41))
    kept = reloaded.tracker
    reloaded.reconfigure(new)
    assert reloaded.tracker is kept  # not a field the windows are built with
    _feed(reloaded, range(41, 101))
    _feed(fresh, range(101))
    _feed(unchanged, range(101))
    want = fresh.tracker.nodes["n1"].gpus["0"].heating_rate(100.0)
    assert want is not None
    # The case tells the two widths apart.
    assert unchanged.tracker.nodes["n1"].gpus["0"].heating_rate(100.0) != want
    assert kept.nodes["n1"].gpus["0"].heating_rate(100.0) == want


def test_a_changed_staleness_reaches_the_racks_already_tracked() -> None:
    old = PolicySettings()
    policy = Policy(old, RACKS)
    policy.observe([_supply(0.0, 30.0)])
    rack = policy.tracker.rack["r1"]
    at = old.rack_stale_after_s / 2
    assert rack.reference(at) == 30.0
    policy.reconfigure(dataclasses.replace(old, rack_stale_after_s=at / 2))
    assert policy.tracker.rack["r1"] is rack
    assert rack.reference(at) is None  # the same reading is stale now


def test_a_changed_margin_floor_starts_the_forecasters_afresh() -> None:
    old = PolicySettings()
    policy = Policy(old, RACKS)
    _feed(policy, range(10))
    kept = policy.tracker
    policy.reconfigure(dataclasses.replace(old, critical_margin_c=old.critical_margin_c + 1.0))
    assert policy.tracker is not kept
