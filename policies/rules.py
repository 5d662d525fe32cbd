"""The per-node state machine: what a node's verdict and the safety gates make of its state.

Pure: state, verdict, gates, settings and ``now`` in; the new state and at most
one step out. The cases, in order (the first that applies wins):

1. Pinned EXCLUDED by an operator: exclude if not excluded; never resume.
2. Pinned NEVER_DRAIN: resume a node rackguard took out; otherwise no action.
3. CRITICAL (a breach now, near shutdown, a leak, a failing loop reaching the
   GPUs): exclude at once, from service or from a drain. Budgets, the storm
   breaker, a pause and the dwell do not apply: hardware first.
4. WARNING (margin at or under the enter margin, a confident forecast breach
   within the drain horizon, or a rack peer's rack-wide drain) while in service:
   drain, unless a safety gate withholds it (pause, storm breaker, budget): then
   stay in service, say why, and ask again at the next evaluation.
5. In service otherwise: no action.
6. Out of service and not healthy (including UNKNOWN: stale or BAD data is never
   healthy): stay out; the healthy timer restarts.
7. Out of service and healthy: resume once healthy for ``resume_after_s`` plus the
   node's own jitter, ``min_dwell_s`` after the drain, and when the rack's resume
   stagger allows; otherwise wait.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from policies.model import REASON_PREFIX, Action, Condition, FaultDomain
from policies.safety import Pin
from policies.settings import PolicySettings


@dataclass(frozen=True, slots=True)
class NodeState:
    """What the policy last asked for a node, and since when (monotonic seconds)."""

    action: Action = Action.RESUME  # RESUME means "in service"
    since: float | None = None
    healthy_since: float | None = None
    epoch: int = 0  # count of transitions: part of each decision's idempotency key
    domain: FaultDomain = FaultDomain.NONE  # why it is out of service
    following: str = ""  # the rack peer whose rack-wide drain it follows
    # Restored (after a restart) out of service for a rack-wide cause whose rack
    # evidence has not been seen fresh since: not healthy until it has.
    awaiting_evidence: bool = False


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the evidence says about a node now."""

    condition: Condition  # OK, WARNING, CRITICAL or UNKNOWN
    healthy: bool  # good enough to resume (never with UNKNOWN data)
    domain: FaultDomain = FaultDomain.NONE
    reason: str = ""  # the decision reason for a drain or exclusion
    following: str = ""
    # Raised by GPU margins or forecasts (whatever the domain names as the cause),
    # not by a facility rule, a leak or a peer: what a GPU's power cap can answer.
    gpu_thermal: bool = False


@dataclass(frozen=True, slots=True)
class Gates:
    """The safety gates' answers for one node now ("" = open)."""

    pin: Pin | None = None
    drain_withheld: str = ""
    resume_withheld: str = ""
    jitter_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Step:
    """A transition to make: the action, its domain and its reason."""

    action: Action
    domain: FaultDomain
    reason: str
    critical: bool = False


RESUME_REASON = f"{REASON_PREFIX} thermal margins healthy again, resuming"
PIN_EXCLUDED_REASON = f"{REASON_PREFIX} excluded by operator pin"
PIN_RESUME_REASON = f"{REASON_PREFIX} operator pinned the node in service, resuming"


def transition(
    state: NodeState, v: Verdict, g: Gates, now: float, s: PolicySettings
) -> tuple[NodeState, Step | None, str]:
    """Apply the cases above; returns the new state, the step (if any) and a note."""
    in_service = state.action is Action.RESUME
    # 1.
    if g.pin is Pin.EXCLUDED:
        if state.action is Action.EXCLUDE:
            return state, None, "pinned excluded by operator"
        step = Step(Action.EXCLUDE, FaultDomain.NODE, PIN_EXCLUDED_REASON, critical=True)
        return _out(state, step, now), step, "pinned excluded by operator"
    # 2.
    if g.pin is Pin.NEVER_DRAIN:
        if in_service:
            return state, None, "pinned in service by operator: no action"
        step = Step(Action.RESUME, FaultDomain.NONE, PIN_RESUME_REASON)
        return _back(state, now), step, "pinned in service by operator"
    # 3.
    if v.condition is Condition.CRITICAL and state.action is not Action.EXCLUDE:
        step = Step(Action.EXCLUDE, v.domain, v.reason, critical=True)
        return _out(state, step, now, v.following), step, ""
    # 4.
    if v.condition is Condition.WARNING and in_service:
        if g.drain_withheld:
            return state, None, f"drain withheld: {g.drain_withheld}"
        step = Step(Action.DRAIN, v.domain, v.reason)
        return _out(state, step, now, v.following), step, ""
    # 5.
    if in_service:
        return state, None, ""
    # 6.
    if not v.healthy:
        return _healthy_since(state, None), None, ""
    # 7.
    healthy_since = state.healthy_since if state.healthy_since is not None else now
    since = state.since if state.since is not None else now
    waited = now - healthy_since >= s.resume_after_s + g.jitter_s
    if waited and now - since >= s.min_dwell_s:
        if g.resume_withheld:
            return _healthy_since(state, healthy_since), None, g.resume_withheld
        step = Step(Action.RESUME, FaultDomain.NONE, RESUME_REASON)
        return _back(state, now), step, ""
    return _healthy_since(state, healthy_since), None, "healthy, waiting to resume"


def _healthy_since(state: NodeState, healthy_since: float | None) -> NodeState:
    """``state`` with ``healthy_since`` set: itself when it already is (every tick out)."""
    if state.healthy_since is healthy_since:  # None, or the very value kept
        return state
    return replace(state, healthy_since=healthy_since)


def _out(state: NodeState, step: Step, now: float, following: str = "") -> NodeState:
    # An escalation (drain -> exclude) restarts the dwell: the exclusion is what ends last.
    return NodeState(step.action, now, None, state.epoch + 1, step.domain, following)


def _back(state: NodeState, now: float) -> NodeState:
    return NodeState(Action.RESUME, now, None, state.epoch + 1)
