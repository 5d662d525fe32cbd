"""The predictive policy: readings in; per node an assessment, a verdict and maybe a decision.

One :class:`Policy` evaluates the nodes of one or more racks. The daemon runs it
for its own node (with the rack evidence its sources see); replay and scoring
run it for every node of a trace. Pure and deterministic: no I/O, no clock, no
logging; ``now`` (monotonic seconds, as readings are stamped) and ``wall`` (for
the decision's timestamp) are arguments.

Per GPU (thermal margin = slowdown temperature - temperature):

* CRITICAL: margin at or under ``critical_margin_c``, or within ``shutdown_margin_c``
  of the shutdown temperature.
* WARNING: margin at or under ``enter_margin_c``; or a trusted trend (one that has
  been beating persistence) makes the *earliest* plausible breach (the confidence
  bound) come within the drain horizon (``lead_time_s x lead_margin``). A drain
  must finish before the breach, so the early edge of the interval is the one
  that counts.
* UNKNOWN: temperature or slowdown threshold missing, stale or BAD.

Per node, in order: a coolant leak, or a failing loop (flow lost, supply rising)
with a GPU at or under the enter margin -> CRITICAL for the cooling loop (on fresh
readings of those series, even while another coolant series is stale or BAD);
any CRITICAL GPU -> CRITICAL; any WARNING GPU -> WARNING; a rack peer out of
service for a rack-wide cause -> WARNING (following it); any UNKNOWN GPU ->
UNKNOWN; else OK. The domain comes from :mod:`policies.attribution`; the
transition from :mod:`policies.rules`; the gates from :mod:`policies.safety`.

Healthy (may resume): every GPU known, every margin at or above ``exit_margin_c``,
no trusted forecast breach within twice the drain horizon, no originating rack
peer still out for a rack-wide cause, and, for a node out for the rack or the
loop, that evidence known (every series fresh) and healthy again; a node restored
out for the rack or the loop (:meth:`Policy.restore`) waits until it has seen
that evidence fresh.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Final

from policies import gradient
from policies.attribution import AirEvidence, LoopEvidence, attribute
from policies.forecast import TimeToThreshold
from policies.headroom import NO_HEADROOM, NodeHeadroom
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
from policies.rules import Gates, NodeState, Verdict, transition
from policies.safety import (
    RACK_DOMAINS,
    BreakerState,
    ClusterView,
    OutOfService,
    Overrides,
    drain_withheld,
    jitter_s,
    resume_withheld,
    update_breaker,
)
from policies.settings import PolicySettings
from policies.tracking import (
    GpuTracker,
    RackTracker,
    SlowSeries,
    Tracker,
    absent,
    fresh,
    fresh_value,
)

# Enum members as compiled constants: looked up on their class, a member costs a
# generic attribute read each time (about 60 ns compiled; a Final here, under 1 ns).
_RESUME: Final = Action.RESUME
_CRITICAL: Final = Condition.CRITICAL
_OK: Final = Condition.OK
_UNKNOWN: Final = Condition.UNKNOWN
_WARNING: Final = Condition.WARNING
_COOLING_LOOP: Final = FaultDomain.COOLING_LOOP
_GPU: Final = FaultDomain.GPU
_NODE: Final = FaultDomain.NODE
_NONE: Final = FaultDomain.NONE
_RACK: Final = FaultDomain.RACK

# The settings the trackers build their windows and fits with: a reload changing one
# starts them afresh. The trackers read the others as they go (Tracker.settings).
_TRACKER_FIELDS = (
    "critical_margin_c",  # the GPU margin forecaster's floor
    "trend_bucket_s",
    "trend_window_s",
    "trend_min_points",
    "confidence",
    "skill_horizon_s",
    "skill_margin",
    "max_gpu_rate_c_per_min",
    "max_air_rate_c_per_min",
    "load_step_fraction",
    "load_settle_s",
)
_DOMAIN_WORDS = {
    FaultDomain.GPU: "GPU",
    FaultDomain.NODE: "node",
    FaultDomain.RACK: "rack",
    FaultDomain.COOLING_LOOP: "cooling loop",
}


@dataclass(init=False, frozen=True, slots=True)
class Outcome:
    """One node's evaluation: the new state, what was seen, and the decision if any."""

    state: NodeState
    node_view: NodeView  # ``node`` holds its assessment
    gpu_views: tuple[GpuView, ...]  # in index order; ``gpus`` holds their assessments
    rack: Assessment | None
    decision: Decision | None
    note: str = ""  # why nothing happened when something might have (withheld, waiting)
    critical: bool = False  # the decision is a critical exclusion
    following: str = ""
    headroom: NodeHeadroom = NO_HEADROOM  # at full load, for steering

    def __init__(
        self,
        state: NodeState,
        node_view: NodeView,
        gpu_views: tuple[GpuView, ...],
        rack: Assessment | None,
        decision: Decision | None,
        note: str = "",
        critical: bool = False,
        following: str = "",
        headroom: NodeHeadroom = NO_HEADROOM,
    ) -> None:
        # Written out, not generated: see policies/native.py (hot dataclasses).
        object.__setattr__(self, "state", state)
        object.__setattr__(self, "node_view", node_view)
        object.__setattr__(self, "gpu_views", gpu_views)
        object.__setattr__(self, "rack", rack)
        object.__setattr__(self, "decision", decision)
        object.__setattr__(self, "note", note)
        object.__setattr__(self, "critical", critical)
        object.__setattr__(self, "following", following)
        object.__setattr__(self, "headroom", headroom)

    @property
    def node(self) -> Assessment:
        """The node's assessment (built when first read)."""
        return self.node_view.assessment

    @property
    def gpus(self) -> tuple[Assessment, ...]:
        """Each GPU's assessment, in index order."""
        return tuple(g.assessment for g in self.gpu_views)


class NodeView:
    """One node's assessment at one evaluation, built when first read, as a GPU's is.

    Its words (the hot GPU's, or why the node is unknown) were formatted for every
    node at every evaluation, although a replay reads only decisions; they are
    formatted, from that evaluation's verdict and GPU views, when someone reads them.
    """

    __slots__ = ("_assessment", "at", "gpus", "hot", "node", "note", "verdict")

    def __init__(
        self,
        node: str,
        at: float,
        verdict: Verdict,
        hot: GpuView | None,
        gpus: tuple[GpuView, ...],
        note: str,
    ) -> None:
        self.node: Final = node
        self.at: Final = at
        self.verdict: Final = verdict
        self.hot: Final = hot  # the GPU the node's numbers are taken from
        self.gpus: Final = gpus
        self.note: Final = note
        self._assessment: Assessment | None = None  # built on first read

    @staticmethod
    def given(assessment: Assessment) -> NodeView:
        """A view whose assessment is already made (an outcome built outside the policy)."""
        verdict = Verdict(assessment.condition, False, assessment.domain)
        view = NodeView(assessment.subject, assessment.at, verdict, None, (), "")
        view._assessment = assessment
        return view

    @property
    def assessment(self) -> Assessment:
        """The node's assessment at that evaluation (built once, when first read)."""
        a = self._assessment
        if a is None:
            verdict, hot = self.verdict, self.hot
            a = self._assessment = Assessment(
                self.node,
                verdict.domain,
                verdict.condition,
                self.at,
                value=hot.value if hot else None,
                unit="celsius" if hot is not None and hot.value is not None else "",
                threshold=hot.threshold if hot else None,
                trend_per_min=hot.trend_per_min if hot else None,
                time_to_threshold_s=hot.ttt.point_s if hot is not None and hot.ttt else None,
                detail=_node_detail(verdict, hot, self.gpus, self.note),
            )
        return a


class GpuView:
    """One GPU as the rules see it at one evaluation; its Assessment is built when read.

    An evaluation makes one per GPU and the rules read only its numbers, as a replay,
    which prints decisions alone, reads nothing else: the words of an assessment's
    detail, formatted for every GPU at every evaluation, were a tenth of a replay.
    They are formatted, from the values and settings of that evaluation, for the
    assessments someone reads (evidence, the API, the node's detail).
    """

    # Fields Final (mypy refuses a second assignment; the build makes them read-only)
    # but the assessment, built on first read.
    __slots__ = (
        "_assessment",
        "_detail",
        "_settings",
        "at",
        "at_risk",
        "condition",
        "fall_c_per_s",
        "fast_heating_c_per_s",
        "full_load_margin",
        "margin",
        "predicted",
        "shutdown",
        "subject",
        "threshold",
        "trend_per_min",
        "ttt",
        "value",
    )

    def __init__(
        self,
        subject: str,
        at: float,
        condition: Condition,
        settings: PolicySettings,
        *,
        value: float | None = None,
        threshold: float | None = None,
        margin: float | None = None,
        ttt: TimeToThreshold | None = None,
        trend_per_min: float | None = None,
        fall_c_per_s: float | None = None,
        predicted: bool = False,
        at_risk: bool = False,
        fast_heating_c_per_s: float | None = None,
        full_load_margin: float | None = None,
        shutdown: float | None = None,
        detail: str = "",
    ) -> None:
        self.subject: Final = subject
        self.at: Final = at
        self.condition: Final = condition
        self._settings: Final = settings
        self.value: Final = value  # the temperature (None: unknown, and ``detail`` says why)
        self.threshold: Final = threshold  # the slowdown temperature
        self.margin: Final = margin
        self.ttt: Final = ttt
        self.trend_per_min: Final = trend_per_min  # set with a trusted trend only
        self.fall_c_per_s: Final = fall_c_per_s  # trusted margin decline rate
        self.predicted: Final = predicted  # WARNING from the forecast alone
        self.at_risk: Final = at_risk  # a forecast breach within twice the drain horizon
        # Heating faster than max_gpu_rate_c_per_min over two confirm windows at flat power
        # (the signature of heat removal failing, not of load): the newer window's rate, C/s.
        self.fast_heating_c_per_s: Final = fast_heating_c_per_s
        # Margin this GPU would have at its enforced power limit, from the lower bound of its
        # thermal resistance estimate and what it rejects heat to now (None: no estimate).
        self.full_load_margin: Final = full_load_margin
        self.shutdown: Final = shutdown  # the shutdown temperature, where it made this CRITICAL
        self._detail: Final = detail
        self._assessment: Assessment | None = None  # built on first read

    @property
    def detail(self) -> str:
        """The assessment's words: the numbers, then the trend, the signatures, the forecast."""
        temp, slow, margin = self.value, self.threshold, self.margin
        if temp is None or slow is None or margin is None:
            return self._detail
        s = self._settings
        # printf-style, which formats the same floats to the same text as an f-string at
        # about two thirds of the cost (interpreted or compiled; mypyc makes an f-string a
        # str.format call).
        words = ["%.0fC, %s slowdown %.0fC" % (temp, _below(margin), slow)]  # noqa: UP031
        if self.trend_per_min is not None:
            words.append("%+.1fC/min" % self.trend_per_min)  # noqa: UP031
        fast = self.fast_heating_c_per_s
        if fast is not None:
            words.append("heating %+.0fC/min at flat power" % (fast * 60))
        full = self.full_load_margin
        if full is not None and full < s.exit_margin_c:
            words.append("%s slowdown at full power" % _below(full))  # noqa: UP031
        ttt = self.ttt
        if ttt is not None and ttt.point_s is not None and ttt.point_s > 0:
            late_w = _minutes(ttt.late_s) if ttt.late_s is not None else "never"
            early_w = _minutes(ttt.early_s) if ttt.early_s is not None else "?"
            band = f"{early_w} to {late_w} at {s.confidence:.0%}"
            words.append(f"slowdown in ~{_minutes(ttt.point_s)} ({band})")
        shut = self.shutdown
        if shut is not None:
            words.append("%.1fC below shutdown %.0fC" % (shut - temp, shut))  # noqa: UP031
        return ", ".join(words)

    @property
    def assessment(self) -> Assessment:
        """The GPU's assessment at that evaluation (built once, when first read)."""
        a = self._assessment
        if a is None:
            ttt = self.ttt
            a = self._assessment = Assessment(
                self.subject,
                _GPU,
                self.condition,
                self.at,
                value=self.value,
                unit="celsius" if self.value is not None else "",
                threshold=self.threshold,
                trend_per_min=self.trend_per_min,
                time_to_threshold_s=ttt.point_s if ttt is not None else None,
                detail=self.detail,
            )
        return a


@dataclass(init=False, frozen=True, slots=True)
class _RackEvidence:
    loop: LoopEvidence
    air: AirEvidence
    assessment: Assessment | None

    def __init__(self, loop: LoopEvidence, air: AirEvidence, assessment: Assessment | None) -> None:
        # Written out, not generated: see policies/native.py (hot dataclasses).
        object.__setattr__(self, "loop", loop)
        object.__setattr__(self, "air", air)
        object.__setattr__(self, "assessment", assessment)


class Policy:
    """The predictive policy over the nodes of some racks; feed readings, then evaluate."""

    def __init__(
        self,
        settings: PolicySettings,
        racks: Mapping[str, tuple[str, ...]],
        *,
        default_node: str | None = None,
    ) -> None:
        self._settings = settings
        self.racks = {rack: tuple(nodes) for rack, nodes in racks.items()}
        self.rack_of = {n: r for r, nodes in self.racks.items() for n in nodes}
        self._default_node = default_node
        self.tracker = Tracker(settings, self.racks, default_node=default_node)
        self.states: dict[str, NodeState] = {n: NodeState() for n in self.rack_of}
        self.breaker = BreakerState()
        # Per node: the GPU dict last seen and its keys in index order (see _gpus).
        self._gpu_order: dict[str, tuple[dict[str, GpuTracker], list[str]]] = {}
        self._read(settings)

    def _read(self, s: PolicySettings) -> None:
        # The settings every GPU's evaluation reads, as attributes of this class:
        # compiled, a native field read (the settings' own fields are generic reads).
        self._horizon_s = s.drain_horizon_s
        self._stale_s = s.stale_after_s
        self._critical_c = s.critical_margin_c
        self._enter_c = s.enter_margin_c
        self._shutdown_c = s.shutdown_margin_c
        self._fastest = s.max_gpu_rate_c_per_min / 60.0
        self._min_points = s.trend_min_points

    @property
    def settings(self) -> PolicySettings:
        """The settings in force."""
        return self._settings

    @settings.setter
    def settings(self, new: PolicySettings) -> None:
        old = self._settings
        self._settings = new
        self._read(new)
        if any(getattr(old, f) != getattr(new, f) for f in _TRACKER_FIELDS):
            # Windows and fits of another shape: start them afresh; states stay.
            self.tracker = Tracker(new, self.racks, default_node=self._default_node)
        else:
            self.tracker.settings = new

    def observe(self, readings: Iterable[Reading]) -> None:
        """Take readings (repeats of a reading already seen change nothing)."""
        self.tracker.observe(readings)

    def restore(
        self, node: str, action: Action, now: float, domain: FaultDomain = FaultDomain.NONE
    ) -> None:
        """Adopt a state decided earlier (e.g. across a restart), with the cause's domain.

        A node out for a rack-wide cause (the cooling loop, the rack's air) is not
        healthy until that evidence has been seen fresh: after a restart the GPUs
        may look fine long before the CDU or PDU source has reported.
        """
        old = self.states.get(node, NodeState())
        out = action is not _RESUME
        self.states[node] = NodeState(
            action=action,
            since=now,
            epoch=old.epoch,
            domain=domain if out else _NONE,
            awaiting_evidence=out and domain in RACK_DOMAINS,
        )

    def evaluate(
        self,
        now: float,
        wall: float,
        view: ClusterView,
        overrides: Overrides | None = None,
        nodes: Iterable[str] | None = None,
    ) -> dict[str, Outcome]:
        """Evaluate ``nodes`` (default: all) at monotonic ``now``."""
        o = overrides or Overrides()
        s = self._settings
        self.breaker = update_breaker(self.breaker, view, now, s, o)
        wanted = list(self.rack_of) if nodes is None else list(nodes)
        gpus = {n: self._gpus(n, now) for n in wanted}
        margins: dict[str, dict[str, float]] = {rk: {} for rk in self.racks}
        trouble: dict[str, int] = dict.fromkeys(self.racks, 0)
        for n in wanted:
            known = [g.margin for g in gpus[n] if g.margin is not None]
            rack = self.rack_of[n]
            if known:
                margins[rack][n] = min(known)
            if any(g.condition in _HOT for g in gpus[n]):
                trouble[rack] += 1
        evidence = {
            rk: self._rack_evidence(rk, now, margins[rk])
            for rk in {self.rack_of[n] for n in wanted}
        }
        out = {}
        for n in wanted:
            rack = self.rack_of[n]
            out[n] = self._node(n, rack, gpus[n], evidence[rack], trouble[rack], now, wall, view, o)
        return out

    # -- GPUs ------------------------------------------------------------------

    def _gpus(self, node: str, now: float) -> list[GpuView]:
        tracker = self.tracker.nodes.get(node)
        if tracker is None:
            return []
        reference = self.tracker.rack[self.rack_of[node]].reference(now)
        by_index = tracker.gpus
        # The GPUs in index order, asked at every evaluation: sorted again only when a
        # GPU appears (the tracker adds GPUs and never removes one) or the dict is new.
        order = self._gpu_order.get(node)
        if order is None or order[0] is not by_index or len(order[1]) != len(by_index):
            order = self._gpu_order[node] = (by_index, sorted(by_index, key=_order))
        # self._gpu called by name: compiled, a native call (a bound method kept in a
        # local is a Python object, called through its wrapper).
        return [self._gpu(index, by_index[index], now, reference) for index in order[1]]

    def _gpu(self, gpu: str, t: GpuTracker, now: float, reference: float | None) -> GpuView:
        s = self._settings
        subject = "gpu" + gpu
        stale = self._stale_s
        critical = self._critical_c
        temp = t.fresh_temperature(now, stale)
        slow = t.fresh_slowdown(now, stale)
        if temp is None or slow is None:
            why_t = fresh(t.temperature, now, stale)[1]
            why_s = fresh(t.slowdown, now, stale)[1]
            detail = f"temperature {why_t}" if temp is None else f"slowdown threshold {why_s}"
            return GpuView(subject, now, _UNKNOWN, s, detail=detail)
        fast = _fast_heating(t, now, self._fastest)
        margin = slow - temp
        forecaster = t.margin
        # A steady GPU's forecaster is untrusted: no trend, no time to threshold.
        ttt: TimeToThreshold | None = None
        per_min: float | None = None
        fall: float | None = None
        predicted = at_risk = False
        trend = forecaster.trend
        if trend is not None and forecaster.trusted:
            ttt = forecaster.time_to(critical, falling=True, at=now)
            per_min = -trend.slope * 60
            fall = -trend.slope if trend.falling else None
            early = ttt.early_s if ttt is not None else None
            if early is not None:
                horizon = self._horizon_s
                predicted = early <= horizon
                at_risk = early <= 2 * horizon
        full = _full_load_margin(t, slow, reference, now, self._min_points, stale)
        shutdown: float | None = None
        enter = self._enter_c
        if margin <= critical:
            cond = _CRITICAL
        elif (shut := t.fresh_shutdown(now, stale)) is not None and (
            shut - temp <= self._shutdown_c
        ):
            cond = _CRITICAL
            shutdown = shut
        elif margin <= enter or predicted:
            cond = _WARNING
        else:
            cond = _OK
        return GpuView(
            subject,
            now,
            cond,
            s,
            value=temp,
            threshold=slow,
            margin=margin,
            ttt=ttt,
            trend_per_min=per_min,
            fall_c_per_s=fall,
            predicted=cond is _WARNING and margin > enter,
            at_risk=at_risk,
            fast_heating_c_per_s=fast,
            full_load_margin=full,
            shutdown=shutdown,
        )

    # -- rack evidence -----------------------------------------------------------

    def _rack_evidence(
        self, rack: str, now: float, node_margins: Mapping[str, float]
    ) -> _RackEvidence:
        rt = self.tracker.rack[rack]
        loop = self._loop(rack, rt, now)
        air, probes = self._air(rack, rt, now)
        supply = _highest_fresh(rt, SensorKind.COOLANT_SUPPLY_TEMPERATURE, now, self._settings)
        ret = _highest_fresh(rt, SensorKind.COOLANT_RETURN_TEMPERATURE, now, self._settings)
        parts = []
        grad = gradient.inlet_gradient(probes)
        if grad is not None:
            vertical = (
                f", top-bottom {grad.vertical_c:+.1f}C" if grad.vertical_c is not None else ""
            )
            range_ = f"spread {grad.spread_c:.1f}C{vertical}"
            parts.append(f"inlet {grad.hottest} {grad.hottest_c:.1f}C ({range_})")
        delta_t = gradient.coolant_delta_t(supply, ret)
        if delta_t is not None:
            parts.append(f"coolant dT {delta_t:.1f}C")
        spread = gradient.margin_spread(node_margins)
        if spread is not None:
            parts.append(f"GPU margin spread across nodes {spread:.1f}C")
        if loop.detail:
            parts.append(f"cooling loop: {loop.detail}")
        if air.detail:
            parts.append(air.detail)
        if not (loop.monitored or air.monitored or spread is not None):
            return _RackEvidence(loop, air, None)
        horizon = self._settings.drain_horizon_s
        if air.over_limit:
            cond, domain = _CRITICAL, _RACK
        elif loop.over_limit:
            cond, domain = _CRITICAL, _COOLING_LOOP
        elif loop.failing or loop.limit_within(horizon):
            # Direct evidence, on fresh readings, whatever else is stale.
            cond, domain = _WARNING, _COOLING_LOOP
        elif air.limit_within(horizon):
            cond, domain = _WARNING, _RACK
        elif (loop.monitored and not loop.known) or (air.monitored and not air.known):
            cond, domain = _UNKNOWN, _NONE
        elif loop.supply_rising:
            cond, domain = _WARNING, _COOLING_LOOP
        elif air.rising:
            cond, domain = _WARNING, _RACK
        else:
            cond, domain = _OK, _NONE
        a = Assessment(
            rack,
            domain,
            cond,
            now,
            value=supply,
            unit="celsius" if supply is not None else "",
            trend_per_min=loop.supply_rate_c_per_s * 60 if loop.supply_rate_c_per_s else None,
            detail="; ".join(parts),
        )
        return _RackEvidence(loop, air, a)

    def _loop(self, rack: str, rt: RackTracker, now: float) -> LoopEvidence:
        s = self._settings
        stale = s.rack_stale_after_s
        confirm = s.flow_loss_confirm_s

        supplies = _present(rt.slow[SensorKind.COOLANT_SUPPLY_TEMPERATURE])
        flows = _present(rt.slow[SensorKind.COOLANT_FLOW])
        returns = _present(rt.slow[SensorKind.COOLANT_RETURN_TEMPERATURE])
        pumps, leaks = _states(rt, SensorKind.PUMP_STATE), _states(rt, SensorKind.LEAK)
        supply_v = [fresh_value(x.latest, now, stale) for _, x in supplies]
        flow_v = [fresh_value(x.latest, now, stale) for _, x in flows]
        return_v = [fresh_value(x.latest, now, stale) for _, x in returns]
        pump_v = [fresh_value(r, now, stale) for _, r in pumps]
        leak_v = [fresh_value(r, now, stale) for _, r in leaks]
        every = [*supply_v, *flow_v, *return_v, *pump_v, *leak_v]
        if not every:
            return LoopEvidence()
        # Every flag below comes from fresh readings only, so a fresh leak or a stopped
        # pump counts even while another coolant series is stale or BAD; ``known``
        # (all of them fresh) is what "healthy" needs. Absent series (not fitted, never
        # present) are neither: they are left out.
        known = all(v is not None for v in every)
        words = []
        leak = any(v is not None and v >= 0.5 for v in leak_v)
        if leak:
            words.append("leak")
        flow_words = []
        flow_confirmed = False
        normal_flow = False
        for (key, f), v in zip(flows, flow_v, strict=True):
            if v is None:
                continue
            high = f.sustained_high
            if high is not None and high > 0 and v < s.flow_low_fraction * high:
                run = rt.runs.get(key)
                sure = run is not None and run.confirmed(confirm)
                flow_confirmed = flow_confirmed or sure
                flow_words.append(
                    f"flow {v:.1f} ({v / high:.0%} of its sustained high, {high:.1f})"
                    + ("" if sure else ", confirming")
                )
            elif v > 0:
                normal_flow = True
        # A stopped pump is lost flow unless the flow says otherwise (a standby pump):
        # with every pump stopped the pumps are believed over the flow meter.
        stopped = sum(v is not None and v < 0.5 for v in pump_v)
        sure_stopped = sum(
            v is not None
            and v < 0.5
            and (run := rt.runs.get(k)) is not None
            and run.confirmed(confirm)
            for (k, _), v in zip(pumps, pump_v, strict=True)
        )
        pump_lost = sure_stopped > 0 and (sure_stopped == len(pump_v) or not normal_flow)
        if pump_lost:
            words.append("pump stopped")
        elif stopped and (stopped == len(pump_v) or not normal_flow):
            words.append("pump stopped, confirming")
        elif stopped:
            words.append("a pump stopped, flow normal")
        words += flow_words
        risen = False
        rate: float | None = None
        limit = _supply_limit(rack, rt, now, s)
        over = False
        early: float | None = None
        for (_, sup), v in zip(supplies, supply_v, strict=True):
            if v is None:
                continue
            level, lowest = sup.held_level(), sup.window_low()
            if level is not None and lowest is not None and level - lowest >= s.supply_rise_c:
                risen = True
                words.append(f"supply {level:.1f}C, +{level - lowest:.1f}C in the window")
            if level is not None and level >= limit:
                over = True
                words.append(f"supply {level:.1f}C at or above its limit {limit:.0f}C")
            r = _rising_rate(sup)
            if r is not None:
                rate = r if rate is None else max(rate, r)
                words.append(f"supply rising {r * 60:+.2f}C/min")
            e = _limit_early(sup, limit, now)
            if e is not None and (early is None or e < early):
                early = e
        if early is not None and not over:
            words.append(f"supply limit {limit:.0f}C in ~{_minutes(early)}")
        silent = rt.coolant_silent(now)
        if silent:
            words.append("cooling unit not answering")
        if not known:
            words.append("some coolant series stale or BAD")
        return LoopEvidence(
            True,
            known,
            leak,
            pump_lost or flow_confirmed,
            risen or rate is not None,
            rate,
            ", ".join(words),
            supply_risen=risen,
            silent=silent,
            limit_c=limit,
            over_limit=over,
            limit_early_s=early,
        )

    def _air(self, rack: str, rt: RackTracker, now: float) -> tuple[AirEvidence, dict[str, float]]:
        stale = self._settings.rack_stale_after_s
        inlets = {k: x for k, x in rt.slow[SensorKind.INLET_TEMPERATURE].items() if not x.absent}
        if not inlets:
            return AirEvidence(), {}
        limit = self._settings.inlet_limit(rack)
        probes: dict[str, float] = {}
        known = True
        over = False
        rate: float | None = None
        early: float | None = None
        words = []
        for key, series in sorted(inlets.items()):
            v = fresh_value(series.latest, now, stale)
            if v is None:
                known = False
                continue
            assert series.latest is not None
            probe = series.latest.labels.get("probe", key)
            probes[probe] = v
            level = series.held_level()
            if level is not None and level >= limit:
                over = True
                words.append(f"inlet {probe} {level:.1f}C at or above its limit {limit:.0f}C")
            r = _rising_rate(series)
            if r is not None and (rate is None or r > rate):
                rate = r
            e = _limit_early(series, limit, now)
            if e is not None and (early is None or e < early):
                early = e
        if rate is not None:
            words.append(f"inlet air rising {rate * 60:+.2f}C/min")
        if early is not None and not over:
            words.append(f"inlet limit {limit:.0f}C in ~{_minutes(early)}")
        if not known:
            words.append("some inlet probes stale or BAD")
        return AirEvidence(True, known, rate, ", ".join(words), limit, over, early), probes

    # -- one node ------------------------------------------------------------------

    def _node(
        self,
        node: str,
        rack: str,
        gpus: list[GpuView],
        ev: _RackEvidence,
        rack_trouble: int,
        now: float,
        wall: float,
        view: ClusterView,
        o: Overrides,
    ) -> Outcome:
        s = self._settings
        state = self.states.get(node, NodeState())
        if state.awaiting_evidence and _evidence_seen(state.domain, ev):
            state = replace(state, awaiting_evidence=False)
        verdict, hot = self._verdict(node, rack, state, gpus, ev, rack_trouble, view)
        pin = o.pins.get(node)
        in_service = state.action is _RESUME
        withheld = (
            drain_withheld(node, rack, verdict.domain, view, s, self.breaker, o)
            if verdict.condition is _WARNING and in_service
            else ""
        )
        if in_service and pin is None and not withheld:
            # What a node in service with no pin and no withheld drain meets (the resume
            # gates and the jitter are read only out of service): one shared value.
            gates = _OPEN
        else:
            gates = Gates(
                pin=pin,
                drain_withheld=withheld,
                resume_withheld=resume_withheld(node, rack, now, view, s),
                jitter_s=jitter_s(node, s),
            )
        new_state, step, note = transition(state, verdict, gates, now, s)
        self.states[node] = new_state
        views = tuple(gpus)
        node_view = NodeView(node, now, verdict, hot, views, note)
        decision = None
        if step is not None:
            evidence = [node_view.assessment]
            evidence += [g.assessment for g in gpus if g.condition in _SHOWN]
            if ev.assessment is not None:
                evidence.append(ev.assessment)
            decision = Decision(
                node=node,
                action=step.action,
                reason=step.reason,
                domain=step.domain,
                at=wall,
                key=idempotency_key(node, step.action, new_state.epoch),
                evidence=tuple(evidence),
                dry_run=s.dry_run,
            )
        return Outcome(
            new_state,
            node_view,
            views,
            ev.assessment,
            decision,
            note,
            critical=step.critical if step is not None else False,
            following=new_state.following if step is not None else "",
            headroom=NodeHeadroom.of([g.full_load_margin for g in gpus]),
        )

    def _verdict(
        self,
        node: str,
        rack: str,
        state: NodeState,
        gpus: list[GpuView],
        ev: _RackEvidence,
        rack_trouble: int,
        view: ClusterView,
    ) -> tuple[Verdict, GpuView | None]:
        s = self._settings
        loop, air = ev.loop, ev.air
        known = [g for g in gpus if g.margin is not None]
        unknown = [g for g in gpus if g.margin is None]
        critical = [g for g in known if g.condition is _CRITICAL]
        warning = [g for g in known if g.condition in _HOT]
        leaders = _leaders(view, node, rack)
        healthy = self._healthy(state, gpus, unknown, loop, air, leaders)
        fall = max((g.fall_c_per_s for g in warning if g.fall_c_per_s), default=None)
        # GPUs heading the same way count toward a node-wide cause, not only those
        # already at the drain line (in a chiller loss all of them are a minute apart).
        affected = [g for g in known if g.condition in _HOT or g.at_risk]
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
            verdict = Verdict(_CRITICAL, False, _COOLING_LOOP, reason)
            return verdict, _worst(near or known)
        if loop.failing and loop.supply_rising and near:
            hot = _worst(near)
            assert hot is not None
            reason = (
                f"{REASON_PREFIX} cooling loop failing ({loop.detail}): "
                f"{_temp_words(hot)} near slowdown {hot.threshold:.0f}C"
            )
            return Verdict(_CRITICAL, False, _COOLING_LOOP, reason), hot
        if critical:
            hot = _worst(critical)
            assert hot is not None
            return Verdict(
                _CRITICAL, False, domain, _reason(hot, len(warning), domain, why, s)
            ), hot
        facility = self._facility(rack, gpus, ev)
        if facility is not None:
            return facility, _worst(near or known)
        if warning:
            hot = _worst([g for g in warning if not g.predicted] or warning)
            assert hot is not None
            return Verdict(_WARNING, False, domain, _reason(hot, len(warning), domain, why, s)), hot
        unfit = [
            g
            for g in known
            if g.full_load_margin is not None and g.full_load_margin < s.enter_margin_c
        ]
        # Unfit for full load drains a node in service and keeps a drained one from
        # resuming: were it resumed, the same estimate would drain it a tick later.
        if unfit:
            return self._unfit(rack, unfit, loop, air), _worst(known)
        # Follow a rack-wide drain that began after this node last came back (a node
        # that resumed on its own evidence does not re-follow what it already saw).
        since = state.since if state.since is not None else float("-inf")
        follow = [x for x in leaders if x.since >= since] if state.action is _RESUME else []
        if state.following and leaders:
            follow = leaders
        if follow:
            lead = follow[0]
            words = _DOMAIN_WORDS[lead.domain]
            reason = f"{REASON_PREFIX} {words} event in {rack} (following {lead.node})"
            return Verdict(_WARNING, False, lead.domain, reason, lead.node), _worst(known)
        if unknown or not gpus:
            return Verdict(_UNKNOWN, False), None
        cond = _OK if healthy or state.action is _RESUME else _WARNING
        return Verdict(cond, healthy, state.domain if cond is _WARNING else domain), _worst(known)

    def _unfit(
        self, rack: str, unfit: list[GpuView], loop: LoopEvidence, air: AirEvidence
    ) -> Verdict:
        """Not fit for new work: a GPU would pass the enter margin at its power limit."""
        worst = min(unfit, key=lambda g: g.full_load_margin or 0.0)
        if loop.supply_rising:
            domain, why = _COOLING_LOOP, f"; cooling loop: {loop.detail}"
        elif air.rising:
            domain, why = _RACK, f"; rack: {air.detail}"
        else:
            domain, why = (_NODE if len(unfit) >= 2 else _GPU), ""
        more = f" (+{len(unfit) - 1} more)" if len(unfit) > 1 else ""
        reason = (
            f"{REASON_PREFIX} {worst.subject} would be "
            f"{_below(worst.full_load_margin or 0.0)} slowdown at full power{more}{why}"
        )
        return Verdict(_WARNING, False, domain, reason)

    def _facility(self, rack: str, gpus: list[GpuView], ev: _RackEvidence) -> Verdict | None:
        """Facility rules: limits reached or forecast, lost flow, heat removal failing."""
        s = self._settings
        loop, air = ev.loop, ev.air
        horizon = s.drain_horizon_s
        if air.over_limit:
            reason = f"{REASON_PREFIX} inlet air of {rack} at or above its limit: {air.detail}"
            return Verdict(_CRITICAL, False, _RACK, reason)
        if loop.over_limit:
            reason = (
                f"{REASON_PREFIX} coolant supply of {rack} at or above its limit: {loop.detail}"
            )
            return Verdict(_CRITICAL, False, _COOLING_LOOP, reason)
        fast = [g for g in gpus if g.fast_heating_c_per_s is not None]
        # Without a current view of the loop (no cooling unit, or it stopped answering),
        # several GPUs heating fast at flat power is heat removal failing, not load.
        signature = len(fast) >= 2 and not loop.current
        if loop.flow_lost or signature:
            if loop.flow_lost:
                cause = f"cooling loop of {rack} lost flow ({loop.detail})"
            else:
                cause = f"{len(fast)} GPUs heating fast at flat power, cooling failing"
            grace = _time_to_slowdown(fast)
            if grace is not None and grace < s.critical_grace_s:
                reason = f"{REASON_PREFIX} {cause}: slowdown in ~{grace:.0f}s"
                return Verdict(_CRITICAL, False, _COOLING_LOOP, reason)
            return Verdict(_WARNING, False, _COOLING_LOOP, f"{REASON_PREFIX} {cause}")
        if loop.limit_within(horizon):
            reason = f"{REASON_PREFIX} coolant supply of {rack} nearing its limit: {loop.detail}"
            return Verdict(_WARNING, False, _COOLING_LOOP, reason)
        if air.limit_within(horizon):
            reason = f"{REASON_PREFIX} inlet air of {rack} nearing its limit: {air.detail}"
            return Verdict(_WARNING, False, _RACK, reason)
        return None

    def _healthy(
        self,
        state: NodeState,
        gpus: list[GpuView],
        unknown: list[GpuView],
        loop: LoopEvidence,
        air: AirEvidence,
        leaders: list[OutOfService],
    ) -> bool:
        s = self._settings
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
        if state.domain is _COOLING_LOOP and loop.monitored and not loop.healthy:
            return False
        return not (state.domain is _RACK and air.monitored and not air.healthy)


_HOT: Final = (Condition.WARNING, Condition.CRITICAL)
_OPEN: Final = Gates()
_SHOWN: Final = (Condition.WARNING, Condition.CRITICAL, Condition.UNKNOWN)


def _order(gpu: str) -> tuple[int, str]:
    return (int(gpu), "") if gpu.isdigit() else (1 << 30, gpu)


def _below(margin: float) -> str:
    """``2.0C below`` or, past the threshold, ``2.0C above`` (never "-2.0C below")."""
    if margin < 0:
        return "%.1fC above" % -margin
    return "%.1fC below" % margin  # noqa: UP031


def _minutes(seconds: float) -> str:
    # As printf, like the GPU words (asked for every GPU with a forecast).
    return "%.0f min" % (seconds / 60) if seconds >= 90 else "%.0fs" % seconds  # noqa: UP031


def _worst(gpus: list[GpuView]) -> GpuView | None:
    """The GPU with the smallest margin (ties: the lower index, as listed)."""
    best: GpuView | None = None
    for g in gpus:
        if g.margin is not None and (best is None or best.margin is None or g.margin < best.margin):
            best = g
    return best


def _temp_words(g: GpuView) -> str:
    assert g.value is not None
    return f"{g.subject} {g.value:.0f}C"


def _reason(g: GpuView, hot_gpus: int, domain: FaultDomain, why: str, s: PolicySettings) -> str:
    assert g.value is not None and g.threshold is not None and g.margin is not None
    others = hot_gpus - 1
    more = f" (+{others} more GPU{'s' if others > 1 else ''})" if others else ""
    if g.condition is _CRITICAL:
        if g.margin <= s.critical_margin_c:
            what = f"at or above slowdown {g.threshold:.0f}C"
        else:
            what = f"near shutdown ({g.detail.rsplit(', ', 1)[-1]})"
        text = f"{REASON_PREFIX} {_temp_words(g)} {what}{more}"
    elif g.predicted and g.ttt is not None and g.ttt.point_s is not None:
        rate = f"{g.trend_per_min:+.1f}C/min" if g.trend_per_min is not None else "rising"
        text = (
            f"{REASON_PREFIX} {_temp_words(g)}, {rate}: near slowdown {g.threshold:.0f}C "
            f"in ~{_minutes(g.ttt.point_s)}{more}"
        )
    else:
        text = f"{REASON_PREFIX} {_temp_words(g)} near slowdown {g.threshold:.0f}C{more}"
    if domain in (_COOLING_LOOP, _RACK) and why:
        text += f"; {_DOMAIN_WORDS[domain]}: {why}"
    return text


def _leaders(view: ClusterView, node: str, rack: str) -> list[OutOfService]:
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


# Module functions, not closures in Policy._loop: compiled, a nested function is an
# object made at every call (once per rack per evaluation) and called through Python.
def _present(by_key: Mapping[str, SlowSeries]) -> list[tuple[str, SlowSeries]]:
    """The series of a kind that are not absent."""
    return [(k, x) for k, x in by_key.items() if not x.absent]


def _states(rt: RackTracker, kind: SensorKind) -> list[tuple[str, Reading]]:
    """The latest readings of a state kind whose series are not absent."""
    return [(k, r) for k, r in rt.state[kind].items() if not absent(r, k in rt.present)]


def _rising_rate(series: SlowSeries) -> float | None:
    f = series.forecaster
    if f.trusted and f.trend is not None and f.trend.rising:
        return f.trend.slope
    return None


def _limit_early(series: SlowSeries, limit: float, now: float) -> float | None:
    """When a series on a trusted rising trend reaches a facility ``limit`` (point estimate).

    Not the early bound, as for a GPU margin: a facility limit is an allowable, not a
    trip, and a slow drift's slope bound over one trend window is wide enough to drain
    hours early; lead_margin is the safety factor.
    """
    if _rising_rate(series) is None:
        return None
    ttt = series.forecaster.time_to(limit, falling=False, at=now)
    return ttt.point_s if ttt is not None else None


def _supply_limit(rack: str, rt: RackTracker, now: float, s: PolicySettings) -> float:
    """The cooling unit's own supply alarm limit where it reports one, else the configured."""
    own = [
        v
        for r in rt.state[SensorKind.COOLANT_SUPPLY_LIMIT].values()
        if (v := fresh_value(r, now, s.rack_stale_after_s)) is not None
    ]
    return min(own) if own else s.supply_limit(rack)


def _fast_heating(t: GpuTracker, now: float, fastest: float) -> float | None:
    """The heating rate (C/s) when both confirm windows exceed ``fastest``, at flat power.

    ``fastest``: the step rate, ``max_gpu_rate_c_per_min / 60``.
    """
    # The rate first: it is rarely that fast, and its window slope is usually known
    # already (worked out when the newest temperature was taken).
    rate = t.fast_heating(now, fastest)
    return rate if rate is not None and t.power_steady() else None


def _full_load_margin(
    t: GpuTracker,
    slowdown: float,
    reference: float | None,
    now: float,
    min_points: int,
    stale_after_s: float,
) -> float | None:
    """Slowdown minus the temperature at the enforced power limit (conservative bound).

    It drains a node in service and holds a drained one out while the estimate stays
    unfit; after a repair the estimate follows within its window of steady periods.
    """
    if reference is None:
        return None
    est = t.resistance.estimate(min_points)
    if est is None:
        return None
    limit = t.fresh_limit(now, stale_after_s)
    if limit is None:
        return None
    return slowdown - (reference + est.lo * limit)


def _time_to_slowdown(fast: list[GpuView]) -> float | None:
    """Seconds until the first fast-heating GPU reaches slowdown at its observed rate."""
    times = [
        g.margin / g.fast_heating_c_per_s
        for g in fast
        if g.margin is not None and g.fast_heating_c_per_s
    ]
    return max(0.0, min(times)) if times else None


def _evidence_seen(domain: FaultDomain, ev: _RackEvidence) -> bool:
    """The rack evidence for a rack-wide ``domain`` is all fresh now."""
    if domain is _COOLING_LOOP:
        return ev.loop.known
    if domain is _RACK:
        return ev.air.known
    return True


def _highest_fresh(
    rt: RackTracker, kind: SensorKind, now: float, s: PolicySettings
) -> float | None:
    """The highest fresh value of a kind (the worst of several supplies or returns)."""
    values = [
        v
        for series in rt.slow[kind].values()
        if (v := fresh_value(series.latest, now, s.rack_stale_after_s)) is not None
    ]
    return max(values) if values else None


def _node_detail(v: Verdict, hot: GpuView | None, gpus: tuple[GpuView, ...], note: str) -> str:
    if v.condition is _UNKNOWN:
        unknown = [f"{g.subject}: {g.detail}" for g in gpus if g.margin is None]
        text = "; ".join(unknown) or "no GPU readings"
    elif v.following:
        text = v.reason.removeprefix(REASON_PREFIX).strip()
    elif hot is not None:
        text = f"{hot.subject}: {hot.detail}"
    else:
        text = ""
    if note:
        text = f"{text} [{note}]" if text else note
    return text
