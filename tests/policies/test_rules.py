"""The node state machine, the safety gates and the attribution, as plain tables."""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import MappingProxyType

import pytest

from policies.attribution import AirEvidence, LoopEvidence, attribute
from policies.model import Action, Condition, FaultDomain
from policies.rules import (
    PIN_EXCLUDED_REASON,
    PIN_RESUME_REASON,
    RESUME_REASON,
    Gates,
    NodeState,
    Verdict,
    transition,
)
from policies.safety import (
    BreakerState,
    ClusterView,
    Event,
    OutOfService,
    Overrides,
    Pin,
    budget,
    drain_withheld,
    jitter_s,
    resume_withheld,
    update_breaker,
)
from policies.settings import PolicySettings

S = PolicySettings(min_dwell_s=60.0, resume_after_s=300.0)
NOW = 10_000.0
IN = NodeState()
DRAINED = NodeState(Action.DRAIN, NOW - 1000, None, 1, FaultDomain.GPU)
EXCLUDED = NodeState(Action.EXCLUDE, NOW - 1000, None, 2, FaultDomain.GPU)
WARN = Verdict(Condition.WARNING, False, FaultDomain.GPU, "rackguard: gpu1 86C near slowdown 90C")
CRIT = Verdict(Condition.CRITICAL, False, FaultDomain.GPU, "rackguard: gpu1 90C at or above")
OK = Verdict(Condition.OK, True)
HOLD = Verdict(Condition.WARNING, False)  # between the margins, or not yet healthy
UNKNOWN = Verdict(Condition.UNKNOWN, False)


@dataclass(frozen=True)
class Case:
    name: str
    state: NodeState
    verdict: Verdict
    gates: Gates
    action: Action | None
    note: str = ""
    after: Action | None = None  # the state's action afterwards (default: action or unchanged)


CASES = [
    # enter
    Case("enter: warning drains a node in service", IN, WARN, Gates(), Action.DRAIN),
    Case("enter: critical excludes a node in service", IN, CRIT, Gates(), Action.EXCLUDE),
    Case("enter: critical escalates a drain", DRAINED, CRIT, Gates(), Action.EXCLUDE),
    # hold
    Case("hold: ok in service does nothing", IN, OK, Gates(), None),
    Case("hold: warning on a drained node does nothing", DRAINED, WARN, Gates(), None),
    Case("hold: critical on an excluded node does nothing", EXCLUDED, CRIT, Gates(), None),
    Case("hold: not yet healthy stays drained", DRAINED, HOLD, Gates(), None),
    Case("hold: warning on an excluded node never downgrades", EXCLUDED, WARN, Gates(), None),
    # unknown
    Case("unknown: never drains", IN, UNKNOWN, Gates(), None),
    Case("unknown: never resumes", DRAINED, UNKNOWN, Gates(), None),
    # budget, breaker, pause: predictive drains only
    Case(
        "budget exhausted: drain withheld",
        IN,
        WARN,
        Gates(drain_withheld="rack budget exhausted (2/2 nodes out in r1)"),
        None,
        "drain withheld: rack budget exhausted (2/2 nodes out in r1)",
    ),
    Case(
        "budget exhausted: critical still excludes",
        IN,
        CRIT,
        Gates(drain_withheld="cluster budget exhausted"),
        Action.EXCLUDE,
    ),
    Case(
        "storm open: drain withheld",
        IN,
        WARN,
        Gates(drain_withheld="storm breaker open (9 trips) until an operator reset"),
        None,
        "drain withheld: storm breaker open (9 trips) until an operator reset",
    ),
    # pins
    Case("pin excluded: excludes a healthy node", IN, OK, Gates(pin=Pin.EXCLUDED), Action.EXCLUDE),
    Case("pin excluded: never resumes", EXCLUDED, OK, Gates(pin=Pin.EXCLUDED), None),
    Case("pin never-drain: no drain on warning", IN, WARN, Gates(pin=Pin.NEVER_DRAIN), None),
    Case("pin never-drain: no exclusion either", IN, CRIT, Gates(pin=Pin.NEVER_DRAIN), None),
    Case(
        "pin never-drain: resumes its drain",
        DRAINED,
        WARN,
        Gates(pin=Pin.NEVER_DRAIN),
        Action.RESUME,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_transition_table(case: Case) -> None:
    new, step, note = transition(case.state, case.verdict, case.gates, NOW, S)
    assert (step.action if step else None) is case.action
    if case.note:
        assert note == case.note
    if step is None:
        assert new.action is case.state.action and new.epoch == case.state.epoch
    else:
        assert new.action is step.action and new.epoch == case.state.epoch + 1
        assert step.critical == (step.action is Action.EXCLUDE)
    if step is not None and step.action is Action.EXCLUDE and case.gates.pin is Pin.EXCLUDED:
        assert step.reason == PIN_EXCLUDED_REASON
    if step is not None and case.gates.pin is Pin.NEVER_DRAIN:
        assert step.reason == PIN_RESUME_REASON


def test_exit_needs_healthy_delay_and_dwell() -> None:
    """Exit: healthy for resume_after (+ jitter) and min_dwell after the drain, then resume."""
    g = Gates(jitter_s=20.0)
    state = replace(DRAINED, since=NOW)
    t = NOW
    state, step, _ = transition(state, OK, g, t, S)  # healthy timer starts
    assert step is None and state.healthy_since == t
    state, step, note = transition(state, OK, g, t + 300.0, S)  # delay done, jitter not
    assert step is None and note == "healthy, waiting to resume"
    state, step, _ = transition(state, HOLD, g, t + 310.0, S)  # a relapse restarts the timer
    assert step is None and state.healthy_since is None
    state, step, _ = transition(state, OK, g, t + 311.0, S)
    state, step, _ = transition(state, OK, g, t + 311.0 + 319.0, S)
    assert step is None
    state, step, _ = transition(state, OK, g, t + 311.0 + 320.0, S)
    assert step is not None and step.action is Action.RESUME and step.reason == RESUME_REASON
    assert state.action is Action.RESUME and state.domain is FaultDomain.NONE


def test_exit_waits_for_the_dwell() -> None:
    s = replace(S, min_dwell_s=900.0, resume_after_s=10.0)
    state = replace(DRAINED, since=NOW, healthy_since=NOW)
    _, step, _ = transition(state, OK, Gates(), NOW + 100.0, s)
    assert step is None
    _, step, _ = transition(state, OK, Gates(), NOW + 900.0, s)
    assert step is not None and step.action is Action.RESUME


def test_staggered_resume_waits_for_the_rack() -> None:
    state = replace(DRAINED, healthy_since=NOW - 1000)
    stagger = "staggered: 1 resume(s) in r1 in the last 60s (at most 1)"
    new, step, note = transition(state, OK, Gates(resume_withheld=stagger), NOW, S)
    assert step is None and note == stagger and new.healthy_since == NOW - 1000
    _, step, _ = transition(new, OK, Gates(), NOW + 1, S)
    assert step is not None and step.action is Action.RESUME


RACKS = MappingProxyType({"r1": ("a", "b", "c", "d"), "r2": ("e", "f", "g", "h")})


def _out(*nodes: str, domain: FaultDomain = FaultDomain.GPU) -> MappingProxyType[str, OutOfService]:
    rack = {n: r for r, ns in RACKS.items() for n in ns}
    return MappingProxyType(
        {n: OutOfService(n, rack[n], Action.DRAIN, domain, NOW - 10) for n in nodes}
    )


@pytest.mark.parametrize(
    ("out", "domain", "settings", "overrides", "expect"),
    [
        ((), FaultDomain.GPU, S, Overrides(), ""),
        (("b",), FaultDomain.GPU, S, Overrides(), ""),
        (
            ("b", "c"),
            FaultDomain.GPU,
            S,
            Overrides(),
            "rack budget exhausted (2/2 nodes out in r1)",
        ),
        # A rack-wide cause is not held to the per-rack budget ...
        (("b", "c"), FaultDomain.COOLING_LOOP, S, Overrides(), ""),
        # ... but to the cluster's.
        (
            ("b", "e", "f"),
            FaultDomain.COOLING_LOOP,
            replace(S, cluster_budget_nodes=3),
            Overrides(),
            "cluster budget exhausted (3/3 nodes out)",
        ),
        (
            (),
            FaultDomain.GPU,
            S,
            Overrides(predictive_paused=True),
            "predictive drains paused by operator",
        ),
    ],
)
def test_drain_budget_table(
    out: tuple[str, ...],
    domain: FaultDomain,
    settings: PolicySettings,
    overrides: Overrides,
    expect: str,
) -> None:
    view = ClusterView(RACKS, _out(*out))
    assert drain_withheld("a", "r1", domain, view, settings, BreakerState(), overrides) == expect


def test_budget_is_the_larger_of_count_and_share() -> None:
    assert budget(4, 2, 25.0) == 2
    assert budget(40, 2, 25.0) == 10
    assert budget(1, 0, 5.0) == 0


def test_storm_breaker_opens_stays_open_and_resets() -> None:
    s = replace(S, storm_trips=3, storm_pct=0.0, storm_window_s=600.0)
    trips = tuple(Event(n, "r1", NOW - 100 + i) for i, n in enumerate("abcd"))
    view = ClusterView(RACKS, trips=trips)
    closed = BreakerState()
    # Three trips: not a storm; the fourth opens it.
    assert not update_breaker(closed, replace(view, trips=trips[:3]), NOW, s, Overrides()).open
    opened = update_breaker(closed, view, NOW, s, Overrides())
    assert opened.open and opened.trips == 4
    blocked = drain_withheld("e", "r2", FaultDomain.GPU, ClusterView(RACKS), s, opened, Overrides())
    assert blocked == "storm breaker open (4 trips) until an operator reset"
    # It stays open long after the trips age out ...
    later = update_breaker(opened, ClusterView(RACKS), NOW + 10_000, s, Overrides())
    assert later == opened
    # ... a reset from before it opened does not close it; one after does,
    later = update_breaker(opened, view, NOW + 1, s, Overrides(storm_reset_at=NOW - 1))
    assert later.open
    reset = Overrides(storm_reset_at=NOW + 5)
    closed_again = update_breaker(opened, view, NOW + 6, s, reset)
    assert not closed_again.open
    # and the trips before the reset no longer count.
    assert not update_breaker(closed_again, view, NOW + 7, s, reset).open


def test_resume_stagger_counts_other_nodes_of_the_rack_in_the_window() -> None:
    s = replace(S, resumes_per_window=1, resume_window_s=60.0)
    recent = ClusterView(RACKS, resumes=(Event("b", "r1", NOW - 30),))
    assert resume_withheld("a", "r1", NOW, recent, s).startswith("staggered: 1 resume(s) in r1")
    assert resume_withheld("a", "r1", NOW + 31, recent, s) == ""
    assert resume_withheld("e", "r2", NOW, recent, s) == ""  # another rack
    two = replace(s, resumes_per_window=2)
    assert resume_withheld("a", "r1", NOW, recent, two) == ""


def test_jitter_is_deterministic_spread_and_bounded() -> None:
    nodes = [f"gpu-node-{i:02d}" for i in range(64)]
    values = [jitter_s(n, S) for n in nodes]
    assert values == [jitter_s(n, S) for n in nodes]
    assert all(0 <= v < S.resume_jitter * S.resume_after_s for v in values)
    assert max(values) - min(values) > 0.8 * S.resume_jitter * S.resume_after_s  # spread out
    assert jitter_s("x", replace(S, resume_jitter=0.0)) == 0.0


LOOP_OK = LoopEvidence(monitored=True, known=True)
LOOP_WARM = LoopEvidence(True, True, supply_rising=True, supply_rate_c_per_s=0.02, detail="warm")
LOOP_LOST = LoopEvidence(True, True, flow_lost=True, detail="pump stopped")
LOOP_STALE = LoopEvidence(True, False, flow_lost=True, detail="pump stopped")
AIR_WARM = AirEvidence(True, True, 0.01, detail="inlet rising")
AIR_OK = AirEvidence(True, True)


@pytest.mark.parametrize(
    ("hot", "loop", "air", "fall", "rack_nodes", "domain"),
    [
        (1, LoopEvidence(), AirEvidence(), 0.05, 1, FaultDomain.GPU),
        (3, LoopEvidence(), AirEvidence(), 0.05, 1, FaultDomain.NODE),
        (1, LOOP_OK, AIR_OK, 0.05, 1, FaultDomain.GPU),
        (8, LOOP_WARM, AIR_OK, 0.02, 1, FaultDomain.COOLING_LOOP),
        # A supply rising much slower than the GPU heats does not explain it.
        (1, LOOP_WARM, AIR_OK, 0.10, 1, FaultDomain.GPU),
        (8, LOOP_LOST, AIR_OK, None, 1, FaultDomain.COOLING_LOOP),
        # Stale loop data cannot name the loop.
        (8, LOOP_STALE, AIR_OK, None, 1, FaultDomain.NODE),
        (8, LOOP_OK, AIR_WARM, 0.015, 1, FaultDomain.RACK),
        (8, LOOP_OK, AIR_WARM, 0.05, 1, FaultDomain.NODE),
        (1, LoopEvidence(), AirEvidence(), 0.05, 3, FaultDomain.RACK),
    ],
)
def test_attribution_table(
    hot: int,
    loop: LoopEvidence,
    air: AirEvidence,
    fall: float | None,
    rack_nodes: int,
    domain: FaultDomain,
) -> None:
    got, why = attribute(
        hot_gpus=hot, loop=loop, air=air, margin_fall_c_per_s=fall, rack_nodes_in_trouble=rack_nodes
    )
    assert got is domain
    if loop is LOOP_STALE:
        assert "cooling loop unknown" in why
