"""One node's verdict at one evaluation, from its GPUs, its rack's evidence and its peers.

In order: a coolant leak, or a failing loop (flow lost, supply rising) with a GPU
at or under the enter margin -> CRITICAL for the cooling loop (on fresh readings of
those series, even while another coolant series is stale or BAD); any CRITICAL
GPU -> CRITICAL; a facility limit reached or forecast, lost flow or heat removal
failing -> the facility's verdict; any WARNING GPU -> WARNING; a GPU unfit for full
load -> WARNING; a rack peer out of service for a rack-wide cause -> WARNING
(following it); any UNKNOWN GPU -> UNKNOWN; else OK. The domain comes from
:mod:`policies.attribution`.

Healthy (may resume): every GPU known, every margin at or above ``exit_margin_c``,
no trusted forecast breach within twice the drain horizon, the inlet air at least
``INLET_CLEAR_C`` under its limit (no resume a probe's next uptick drains again), no
originating rack peer still out for a rack-wide cause, and, for a node out for the
rack or the loop, that evidence known (every series fresh) and healthy again.
"""

from __future__ import annotations

from typing import Final

from policies import wording
from policies.attribution import AirEvidence, LoopEvidence, attribute
from policies.gpu import GpuView, least_margin
from policies.model import REASON_PREFIX, Action, Condition, FaultDomain
from policies.rack import RackEvidence
from policies.rules import NodeState, Verdict
from policies.safety import RACK_DOMAINS, ClusterView, OutOfService
from policies.settings import PolicySettings

HOT: Final = (Condition.WARNING, Condition.CRITICAL)
# Back into service only with the inlet air this far under its limit: a node resumed
# with the air just under it is drained again at the next uptick of the probe (a flap).
INLET_CLEAR_C: Final = 2.0


def judge_node(
    node: str,
    rack: str,
    state: NodeState,
    gpus: list[GpuView],
    ev: RackEvidence,
    rack_trouble: int,
    view: ClusterView,
    s: PolicySettings,
    *,
    derated: bool = False,
) -> tuple[Verdict, GpuView | None]:
    """What the evidence says about ``node`` now, and the GPU its numbers are taken from.

    ``derated``: the cap ladder's inlet derate is enforced on every GPU of the node
    (:meth:`policies.power_cap.CapLadder.derated`): its inlet air is held to the rack's
    derate limit instead of the inlet limit.
    """
    loop, air = ev.loop, ev.air
    known = [g for g in gpus if g.margin is not None]
    unknown = [g for g in gpus if g.margin is None]
    critical = [g for g in known if g.condition is Condition.CRITICAL]
    warning = [g for g in known if g.condition in HOT]
    leaders = leaders_of(view, node, rack)
    healthy = _healthy(state, gpus, unknown, loop, air, leaders, s)
    fall = max((g.fall_c_per_s for g in warning if g.fall_c_per_s), default=None)
    # GPUs heading the same way count toward a node-wide cause, not only those
    # already at the drain line (in a chiller loss all of them are a minute apart).
    affected = [g for g in known if g.condition in HOT or g.at_risk]
    domain, why = attribute(
        hot_gpus=len(affected),
        loop=loop,
        air=air,
        margin_fall_c_per_s=fall,
        rack_nodes_in_trouble=rack_trouble,
    )
    near = [g for g in known if g.margin is not None and g.margin <= s.enter_margin_c]
    # A leak, or a failing loop whose heat has reached this node's GPUs: exclude now,
    # on fresh readings of those series whether or not the others are fresh.
    if loop.leak:
        reason = f"{REASON_PREFIX} coolant leak in the cooling loop of {rack}"
        verdict = Verdict(Condition.CRITICAL, False, FaultDomain.COOLING_LOOP, reason)
        return verdict, least_margin(near or known)
    if loop.failing and loop.supply_rising and near:
        hot = least_margin(near)
        assert hot is not None
        reason = (
            f"{REASON_PREFIX} cooling loop failing ({loop.detail}): "
            f"{wording.temp_words(hot)} near slowdown {hot.threshold:.0f}C"
        )
        return Verdict(Condition.CRITICAL, False, FaultDomain.COOLING_LOOP, reason), hot
    if critical:
        hot = least_margin(critical)
        assert hot is not None
        return Verdict(
            Condition.CRITICAL, False, domain, wording.reason(hot, len(warning), domain, why, s)
        ), hot
    facility = _facility(rack, gpus, ev, s, derated)
    if facility is not None:
        return facility, least_margin(near or known)
    if warning:
        hot = least_margin([g for g in warning if not g.predicted] or warning)
        assert hot is not None
        reason = wording.reason(hot, len(warning), domain, why, s)
        return Verdict(Condition.WARNING, False, domain, reason, gpu_thermal=True), hot
    unfit = [
        g for g in known if g.full_load_margin is not None and g.full_load_margin < s.enter_margin_c
    ]
    # Unfit for full load drains a node in service and keeps a drained one from
    # resuming: were it resumed, the same estimate would drain it a tick later.
    if unfit:
        return _unfit(rack, unfit, loop, air), least_margin(known)
    # Follow a rack-wide drain that began after this node last came back (a node
    # that resumed on its own evidence does not re-follow what it already saw).
    since = state.since if state.since is not None else float("-inf")
    follow = [x for x in leaders if x.since >= since] if state.action is Action.RESUME else []
    if state.following and leaders:
        follow = leaders
    if follow:
        lead = follow[0]
        words = wording.DOMAIN_WORDS[lead.domain]
        reason = f"{REASON_PREFIX} {words} event in {rack} (following {lead.node})"
        return Verdict(Condition.WARNING, False, lead.domain, reason, lead.node), least_margin(
            known
        )
    if unknown or not gpus:
        return Verdict(Condition.UNKNOWN, False), None
    cond = Condition.OK if healthy or state.action is Action.RESUME else Condition.WARNING
    return Verdict(
        cond, healthy, state.domain if cond is Condition.WARNING else domain
    ), least_margin(known)


def _unfit(rack: str, unfit: list[GpuView], loop: LoopEvidence, air: AirEvidence) -> Verdict:
    """Not fit for new work: a GPU would pass the enter margin at its power limit."""
    worst = min(unfit, key=lambda g: g.full_load_margin or 0.0)
    if loop.supply_rising:
        domain, why = FaultDomain.COOLING_LOOP, f"; cooling loop: {loop.detail}"
    elif air.rising:
        domain, why = FaultDomain.RACK, f"; rack: {air.detail}"
    else:
        domain, why = (FaultDomain.NODE if len(unfit) >= 2 else FaultDomain.GPU), ""
    more = f" (+{len(unfit) - 1} more)" if len(unfit) > 1 else ""
    reason = (
        f"{REASON_PREFIX} {worst.subject} would be "
        f"{wording.below(worst.full_load_margin or 0.0)} slowdown at full power{more}{why}"
    )
    return Verdict(Condition.WARNING, False, domain, reason, gpu_thermal=True)


def _facility(
    rack: str, gpus: list[GpuView], ev: RackEvidence, s: PolicySettings, derated: bool
) -> Verdict | None:
    """Facility rules: limits reached or forecast, lost flow, heat removal failing."""
    loop, air = ev.loop, ev.air
    horizon = s.drain_horizon_s
    derate = ev.derate if derated else None
    if derate is not None:
        air_over, air_near = derate.over, derate.within(horizon)
        limit, detail = "its derate limit", derate.words()
    else:
        air_over, air_near = air.over_limit, air.limit_within(horizon)
        limit, detail = "its limit", air.detail
    if air_over:
        reason = f"{REASON_PREFIX} inlet air of {rack} at or above {limit}: {detail}"
        return Verdict(Condition.CRITICAL, False, FaultDomain.RACK, reason)
    if loop.over_limit:
        reason = f"{REASON_PREFIX} coolant supply of {rack} at or above its limit: {loop.detail}"
        return Verdict(Condition.CRITICAL, False, FaultDomain.COOLING_LOOP, reason)
    fast = [g for g in gpus if g.fast_heating_c_per_s is not None]
    # Without a current view of the loop (no cooling unit, or it stopped answering),
    # several GPUs heating fast at flat power is heat removal failing, not load.
    signature = len(fast) >= 2 and not loop.current
    if loop.flow_lost or signature:
        if loop.flow_lost:
            cause = f"cooling loop of {rack} lost flow ({loop.detail})"
        else:
            cause = f"{len(fast)} GPUs heating fast at flat power, cooling failing"
        grace = time_to_slowdown(fast)
        if grace is not None and grace < s.critical_grace_s:
            reason = f"{REASON_PREFIX} {cause}: slowdown in ~{grace:.0f}s"
            return Verdict(Condition.CRITICAL, False, FaultDomain.COOLING_LOOP, reason)
        return Verdict(
            Condition.WARNING, False, FaultDomain.COOLING_LOOP, f"{REASON_PREFIX} {cause}"
        )
    if loop.limit_within(horizon):
        reason = f"{REASON_PREFIX} coolant supply of {rack} nearing its limit: {loop.detail}"
        return Verdict(Condition.WARNING, False, FaultDomain.COOLING_LOOP, reason)
    if air_near:
        reason = f"{REASON_PREFIX} inlet air of {rack} nearing {limit}: {detail}"
        return Verdict(Condition.WARNING, False, FaultDomain.RACK, reason)
    return None


def _healthy(
    state: NodeState,
    gpus: list[GpuView],
    unknown: list[GpuView],
    loop: LoopEvidence,
    air: AirEvidence,
    leaders: list[OutOfService],
    s: PolicySettings,
) -> bool:
    if not gpus or unknown or (state.following and leaders) or state.awaiting_evidence:
        return False
    for g in gpus:
        if g.margin is None or g.margin < s.exit_margin_c or g.at_risk:
            return False
        if g.fast_heating_c_per_s is not None:
            return False
    # Never back into a rack past (or heading for) a facility limit, or a loop without flow.
    horizon = 2 * s.drain_horizon_s
    if loop.flow_lost or loop.limit_within(horizon) or air.limit_within(horizon):
        return False
    clear = air.limit_c - INLET_CLEAR_C if air.limit_c is not None else None
    if air.level_c is not None and clear is not None and air.level_c > clear:
        return False
    if state.domain is FaultDomain.COOLING_LOOP and loop.monitored and not loop.healthy:
        return False
    return not (state.domain is FaultDomain.RACK and air.monitored and not air.healthy)


def leaders_of(view: ClusterView, node: str, rack: str) -> list[OutOfService]:
    """Rack peers out of service for a rack-wide cause on their own evidence."""
    if not view.out:
        return []  # the usual case, asked for every node at every evaluation
    return sorted(
        (
            o
            for o in view.out.values()
            if o.rack == rack and o.node != node and o.domain in RACK_DOMAINS and not o.following
        ),
        key=lambda o: (o.since, o.node),
    )


def time_to_slowdown(fast: list[GpuView]) -> float | None:
    """Seconds until the first fast-heating GPU reaches slowdown at its observed rate."""
    times = [
        g.margin / g.fast_heating_c_per_s
        for g in fast
        if g.margin is not None and g.fast_heating_c_per_s
    ]
    return max(0.0, min(times)) if times else None
