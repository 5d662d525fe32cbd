"""The threshold rule, table by table: enter, hold, escalate, exit, unknown, dry run."""

from __future__ import annotations

from dataclasses import replace

import pytest

from policies.model import (
    REASON_PREFIX,
    Action,
    Condition,
    FaultDomain,
    Quality,
    Reading,
    SensorKind,
)
from policies.threshold import NodeState, ThresholdSettings, evaluate

S = ThresholdSettings(
    enter_margin_c=5,
    exit_margin_c=10,
    critical_margin_c=0,
    min_dwell_s=60,
    resume_after_s=120,
    stale_after_s=5,
)
SLOWDOWN = 90.0


def gpu(
    i: int,
    temp: float | None,
    *,
    at: float = 100.0,
    slowdown: float | None = SLOWDOWN,
    quality: Quality = Quality.GOOD,
) -> list[Reading]:
    labels = {"gpu": str(i)}
    t_q = quality if temp is not None else Quality.BAD
    out = [
        Reading(
            "gpus",
            f"gpu{i}.temperature",
            SensorKind.GPU_TEMPERATURE,
            temp if t_q is not Quality.BAD else None,
            "celsius",
            t_q,
            at,
            at,
            reason="" if t_q is Quality.GOOD else "NVML_ERROR_UNKNOWN",
            labels=labels,
        ),
    ]
    s_q = Quality.GOOD if slowdown is not None else Quality.BAD
    out.append(
        Reading(
            "gpus",
            f"gpu{i}.slowdown_threshold",
            SensorKind.GPU_SLOWDOWN_THRESHOLD,
            slowdown,
            "celsius",
            s_q,
            at,
            at,
            reason="" if slowdown is not None else "NVML_ERROR_NOT_SUPPORTED",
            labels=labels,
        )
    )
    return out


def node(*temps: float | None, at: float = 100.0) -> list[Reading]:
    return [r for i, t in enumerate(temps) for r in gpu(i, t, at=at)]


IN_SERVICE = NodeState()
DRAINED = NodeState(Action.DRAIN, since=0.0, epoch=1)
EXCLUDED = NodeState(Action.EXCLUDE, since=0.0, epoch=1)


@pytest.mark.parametrize(
    ("name", "state", "temps", "expect_action", "expect_cond"),
    [
        ("cool stays in service", IN_SERVICE, (60, 65), None, Condition.OK),
        ("enter margin drains", IN_SERVICE, (60, 85), Action.DRAIN, Condition.WARNING),
        ("just above enter holds", IN_SERVICE, (60, 84.9), None, Condition.OK),
        ("at slowdown excludes", IN_SERVICE, (60, 90), Action.EXCLUDE, Condition.CRITICAL),
        ("drained escalates to exclude", DRAINED, (91, 60), Action.EXCLUDE, Condition.CRITICAL),
        ("drained, still warm: hold", DRAINED, (60, 83), None, Condition.WARNING),
        ("drained, healthy: ok, timer starts", DRAINED, (60, 79), None, Condition.OK),
        ("drained, still hot: hold", DRAINED, (60, 86), None, Condition.WARNING),
        ("excluded, warning: hold (no de-escalation)", EXCLUDED, (86, 60), None, Condition.WARNING),
        ("unknown temp: no drain", IN_SERVICE, (60, None), None, Condition.UNKNOWN),
        ("unknown but another hot: drain", IN_SERVICE, (86, None), Action.DRAIN, Condition.WARNING),
    ],
)
def test_transitions(
    name: str,
    state: NodeState,
    temps: tuple[float | None, ...],
    expect_action: Action | None,
    expect_cond: Condition,
) -> None:
    out = evaluate("n1", state, node(*temps), 100.0, 1e9, S)
    assert out.node.condition is expect_cond, name
    assert (out.decision.action if out.decision else None) is expect_action, name


def test_drain_decision_carries_reason_domain_and_evidence() -> None:
    out = evaluate("n1", IN_SERVICE, node(60, 61, 62, 86), 100.0, 1700000000.0, S)
    d = out.decision
    assert d is not None
    assert d.reason == f"{REASON_PREFIX} gpu3 86C near slowdown 90C"
    assert d.domain is FaultDomain.GPU  # one hot GPU: its cold plate
    assert d.at == 1700000000.0
    assert d.evidence[0].subject == "n1"
    assert out.state.action is Action.DRAIN and out.state.epoch == 1


def test_one_critical_gpu_counts_once() -> None:
    out = evaluate("n1", IN_SERVICE, node(60, 91), 100.0, 0.0, S)
    assert out.decision is not None and out.decision.action is Action.EXCLUDE
    assert out.decision.reason == f"{REASON_PREFIX} gpu1 91C at or above slowdown 90C"
    assert out.decision.domain is FaultDomain.GPU


def test_several_hot_gpus_point_at_the_node() -> None:
    out = evaluate("n1", IN_SERVICE, node(86, 87, 60), 100.0, 0.0, S)
    assert out.decision is not None
    assert out.decision.domain is FaultDomain.NODE
    assert "(+1 more GPU)" in out.decision.reason
    assert "gpu1 87C" in out.decision.reason  # the hottest names the reason


def test_idempotency_keys_differ_per_transition_and_repeat_per_replay() -> None:
    a = evaluate("n1", IN_SERVICE, node(86), 100.0, 0.0, S)
    b = evaluate("n1", IN_SERVICE, node(86), 100.0, 0.0, S)
    assert a.decision and b.decision and a.decision.key == b.decision.key  # deterministic
    c = evaluate("n1", a.state, node(91), 101.0, 0.0, S)
    assert c.decision and c.decision.key != a.decision.key


def test_resume_needs_healthy_delay_and_dwell() -> None:
    state = NodeState(Action.DRAIN, since=0.0, epoch=1)
    # Healthy from t=10: not before t=130 (resume_after 120), dwell 60 already met.
    t = 10.0
    out = evaluate("n1", state, node(60, 60, at=t), t, 0.0, S)
    assert out.decision is None and out.state.healthy_since == 10.0
    state = out.state
    for t in (50.0, 100.0, 129.0):
        out = evaluate("n1", state, node(60, 60, at=t), t, 0.0, S)
        assert out.decision is None, t
        state = out.state
    out = evaluate("n1", state, node(60, 60, at=130.0), 130.0, 0.0, S)
    assert out.decision is not None and out.decision.action is Action.RESUME
    assert out.decision.domain is FaultDomain.NONE
    assert out.state == NodeState(Action.RESUME, 130.0, None, 2)


def test_min_dwell_holds_even_when_healthy() -> None:
    s = replace(S, resume_after_s=0.0, min_dwell_s=60.0)
    state = NodeState(Action.DRAIN, since=100.0, epoch=1)
    out = evaluate("n1", state, node(50, at=130.0), 130.0, 0.0, s)
    assert out.decision is None
    out = evaluate("n1", out.state, node(50, at=160.0), 160.0, 0.0, s)
    assert out.decision is not None and out.decision.action is Action.RESUME


@pytest.mark.parametrize(
    "interruption",
    ["between margins", "unknown", "stale"],
)
def test_healthy_timer_restarts_on_interruption(interruption: str) -> None:
    state = NodeState(Action.DRAIN, since=0.0, healthy_since=10.0, epoch=1)
    if interruption == "between margins":
        readings = node(60, 83, at=100.0)  # 7C margin: between enter 5 and exit 10
    elif interruption == "unknown":
        readings = node(60, None, at=100.0)
    else:
        readings = node(60, 60, at=90.0)  # 10 s old at t=100 > stale_after 5
    out = evaluate("n1", state, readings, 100.0, 0.0, S)
    assert out.decision is None
    assert out.state.healthy_since is None
    assert out.state.action is Action.DRAIN


def test_stale_readings_are_unknown_never_all_clear() -> None:
    out = evaluate("n1", IN_SERVICE, node(88, at=10.0), 100.0, 0.0, S)
    assert out.node.condition is Condition.UNKNOWN
    assert out.decision is None  # a stale hot reading does not drain either
    assert "stale" in out.node.detail


def test_missing_threshold_is_unknown() -> None:
    out = evaluate("n1", IN_SERVICE, gpu(0, 70.0, slowdown=None), 100.0, 0.0, S)
    assert out.gpus[0].condition is Condition.UNKNOWN
    assert "slowdown threshold" in out.gpus[0].detail


def test_no_readings_is_unknown() -> None:
    out = evaluate("n1", DRAINED, [], 100.0, 0.0, S)
    assert out.node.condition is Condition.UNKNOWN and out.decision is None


def test_thresholds_come_from_readings_not_constants() -> None:
    # An A100 (slowdown 89) at 84C is at the enter margin; an H100 (90) at 84C is not.
    a100 = [r for r in gpu(0, 84.0, slowdown=89.0)]
    h100 = [r for r in gpu(0, 84.0, slowdown=90.0)]
    assert evaluate("n", IN_SERVICE, a100, 100.0, 0.0, S).decision is not None
    assert evaluate("n", IN_SERVICE, h100, 100.0, 0.0, S).decision is None


def test_dry_run_decides_and_marks() -> None:
    out = evaluate("n1", IN_SERVICE, node(86), 100.0, 0.0, replace(S, dry_run=True))
    assert out.decision is not None and out.decision.dry_run
    assert out.state.action is Action.DRAIN  # reports as if it had acted
