"""The first rule: a GPU thermal-margin threshold with hysteresis, dwell and a healthy delay.

Pure: readings, state, settings and ``now`` in; assessments, decisions and the new
state out. No I/O, no clock reads, no logging.

Margin = slowdown temperature (read from NVML) - GPU temperature. Per node:

1. Any GPU at or under ``critical_margin_c``  -> CRITICAL: exclude at once
   (from service or from a drain; dwell does not apply: hardware first).
2. Else any GPU at or under ``enter_margin_c`` -> WARNING: drain (if in service).
3. Else every GPU known and at or above ``exit_margin_c`` -> OK: a drained or
   excluded node is resumed once it has been OK for ``resume_after_s`` and
   ``min_dwell_s`` has passed since the drain or exclusion.
4. Between the two margins -> hold whatever state the node is in (hysteresis),
   and restart the healthy timer.
5. UNKNOWN (a GPU's temperature or threshold stale, BAD or missing, and no GPU
   in 1-2): hold. Never drains on missing data, never resumes on it either;
   the healthy timer restarts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from policies.model import (
    REASON_PREFIX,
    Action,
    Assessment,
    Condition,
    Decision,
    FaultDomain,
    Reading,
    SensorKind,
    idempotency_key,
)


@dataclass(frozen=True, slots=True)
class ThresholdSettings:
    """The rule's knobs; validated by the daemon's config."""

    enter_margin_c: float = 5.0
    exit_margin_c: float = 10.0
    critical_margin_c: float = 0.0
    min_dwell_s: float = 60.0
    resume_after_s: float = 300.0
    stale_after_s: float = 5.0
    dry_run: bool = False


@dataclass(frozen=True, slots=True)
class NodeState:
    """What the rule last asked for this node, and since when (monotonic seconds)."""

    action: Action = Action.RESUME  # RESUME means "in service"
    since: float | None = None
    healthy_since: float | None = None
    epoch: int = 0  # count of transitions: part of each decision's idempotency key


@dataclass(frozen=True, slots=True)
class Outcome:
    """One evaluation's result."""

    state: NodeState
    node: Assessment
    gpus: tuple[Assessment, ...]
    decision: Decision | None


def _fresh(r: Reading | None, now: float, stale_after: float) -> tuple[float | None, str]:
    if r is None:
        return None, "no reading"
    if not r.usable or r.value is None:
        return None, f"{r.quality.value}: {r.reason}"
    if now - r.mono > stale_after:
        return None, f"stale ({now - r.mono:.0f}s old)"
    return r.value, ""


def assess_gpus(
    readings: Iterable[Reading], now: float, settings: ThresholdSettings
) -> tuple[Assessment, ...]:
    """One assessment per GPU seen in the readings, by thermal margin."""
    temps: dict[str, Reading] = {}
    slowdowns: dict[str, Reading] = {}
    for r in readings:
        gpu = r.labels.get("gpu")
        if gpu is None:
            continue
        if r.kind is SensorKind.GPU_TEMPERATURE:
            temps[gpu] = r
        elif r.kind is SensorKind.GPU_SLOWDOWN_THRESHOLD:
            slowdowns[gpu] = r
    out = []
    for gpu in sorted(set(temps) | set(slowdowns), key=_gpu_order):
        temp, why_t = _fresh(temps.get(gpu), now, settings.stale_after_s)
        slow, why_s = _fresh(slowdowns.get(gpu), now, settings.stale_after_s)
        subject = f"gpu{gpu}"
        if temp is None or slow is None:
            detail = f"temperature {why_t}" if temp is None else f"slowdown threshold {why_s}"
            out.append(Assessment(subject, FaultDomain.GPU, Condition.UNKNOWN, now, detail=detail))
            continue
        margin = slow - temp
        if margin <= settings.critical_margin_c:
            cond = Condition.CRITICAL
        elif margin <= settings.enter_margin_c:
            cond = Condition.WARNING
        else:
            # Above the enter margin; whether it is healthy enough to resume
            # (at or above the exit margin) is the node's question.
            cond = Condition.OK
        out.append(
            Assessment(
                subject,
                FaultDomain.GPU,
                cond,
                now,
                value=temp,
                unit="celsius",
                threshold=slow,
                detail=f"{temp:.0f}C, {margin:.1f}C below slowdown {slow:.0f}C",
            )
        )
    return tuple(out)


def _gpu_order(gpu: str) -> tuple[int, str]:
    return (int(gpu), "") if gpu.isdigit() else (1 << 30, gpu)


def _margin(a: Assessment) -> float:
    assert a.threshold is not None and a.value is not None
    return a.threshold - a.value


def evaluate(
    node: str,
    state: NodeState,
    readings: Iterable[Reading],
    now: float,
    wall: float,
    settings: ThresholdSettings,
) -> Outcome:
    """Apply the rule to one node's latest readings at monotonic time ``now``."""
    gpus = assess_gpus(readings, now, settings)
    known = [g for g in gpus if g.condition is not Condition.UNKNOWN]
    unknown = [g for g in gpus if g.condition is Condition.UNKNOWN]
    critical = [g for g in known if g.condition is Condition.CRITICAL]
    warning = [g for g in known if _margin(g) <= settings.enter_margin_c]
    healthy = (
        bool(gpus) and not unknown and all(_margin(g) >= settings.exit_margin_c for g in known)
    )

    if critical:
        cond, hot = Condition.CRITICAL, min(critical, key=_margin)
    elif warning:
        cond, hot = Condition.WARNING, min(warning, key=_margin)
    elif unknown or not gpus:
        cond, hot = Condition.UNKNOWN, None
    else:
        hot = min(known, key=_margin)
        # Hysteresis: a node out of service stays WARNING until it is healthy.
        cond = Condition.OK if healthy or state.action is Action.RESUME else Condition.WARNING

    domain = FaultDomain.NONE
    if warning:  # every GPU at or under the enter margin, critical ones included
        # One hot GPU points at its cold plate; several at the node.
        domain = FaultDomain.GPU if len(warning) == 1 else FaultDomain.NODE
    if cond is Condition.UNKNOWN:
        detail = "; ".join(f"{g.subject}: {g.detail}" for g in unknown) or "no GPU readings"
    else:
        detail = f"{hot.subject}: {hot.detail}" if hot else ""
    node_assessment = Assessment(
        node,
        domain,
        cond,
        now,
        value=hot.value if hot else None,
        unit="celsius" if hot else "",
        threshold=hot.threshold if hot else None,
        detail=detail,
    )

    new_state, action = _transition(state, cond, healthy, now, settings)
    decision = None
    if action is not None:
        new_state = replace(new_state, epoch=state.epoch + 1)
        decision = Decision(
            node=node,
            action=action,
            reason=_reason(action, cond, hot, len(warning)),
            domain=domain if action is not Action.RESUME else FaultDomain.NONE,
            at=wall,
            key=idempotency_key(node, action, new_state.epoch),
            evidence=(node_assessment, *(g for g in gpus if g.condition is not Condition.OK)),
            dry_run=settings.dry_run,
        )
    return Outcome(new_state, node_assessment, gpus, decision)


def _transition(
    state: NodeState, cond: Condition, healthy: bool, now: float, s: ThresholdSettings
) -> tuple[NodeState, Action | None]:
    in_service = state.action is Action.RESUME
    if cond is Condition.CRITICAL and state.action is not Action.EXCLUDE:
        return NodeState(Action.EXCLUDE, now, None, state.epoch), Action.EXCLUDE
    if cond is Condition.WARNING and in_service:
        return NodeState(Action.DRAIN, now, None, state.epoch), Action.DRAIN
    if in_service:
        return state, None
    if not healthy:
        return replace(state, healthy_since=None), None
    healthy_since = state.healthy_since if state.healthy_since is not None else now
    since = state.since if state.since is not None else now
    if now - healthy_since >= s.resume_after_s and now - since >= s.min_dwell_s:
        return NodeState(Action.RESUME, now, None, state.epoch), Action.RESUME
    return replace(state, healthy_since=healthy_since), None


def _reason(action: Action, cond: Condition, hot: Assessment | None, hot_gpus: int) -> str:
    if action is Action.RESUME:
        return f"{REASON_PREFIX} thermal margins healthy again, resuming"
    assert hot is not None and hot.value is not None and hot.threshold is not None
    what = "at or above" if cond is Condition.CRITICAL else "near"
    others = hot_gpus - 1
    more = f" (+{others} more GPU{'s' if others > 1 else ''})" if others else ""
    return (
        f"{REASON_PREFIX} {hot.subject} {hot.value:.0f}C {what} slowdown {hot.threshold:.0f}C{more}"
    )
