"""The predictive policy: readings in; per node an assessment, a verdict and maybe a decision.

One :class:`Policy` evaluates the nodes of one or more racks. The daemon runs it
for its own node (with the rack evidence its sources see); replay and scoring
run it for every node of a trace. Pure and deterministic: no I/O, no clock, no
logging; ``now`` (monotonic seconds, as readings are stamped) and ``wall`` (for
the decision's timestamp) are arguments.

Each evaluation takes every GPU's view (:mod:`policies.gpu`), each rack's
evidence once (:mod:`policies.rack`), then each node's verdict
(:mod:`policies.node`), its transition (:mod:`policies.rules`) through the gates
(:mod:`policies.safety`), and a decision when the transition makes one. A node
restored out for the rack or the loop (:meth:`Policy.restore`) waits until it has
seen that evidence fresh.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Final

from policies.gpu import GpuView, assess_gpu, gpu_order
from policies.gpu_tracker import GpuTracker
from policies.headroom import NO_HEADROOM, NodeHeadroom
from policies.model import (
    Action,
    Assessment,
    Condition,
    Decision,
    FaultDomain,
    Reading,
    idempotency_key,
)
from policies.node import HOT, judge_node
from policies.power_cap import CapDecision, CapLadder
from policies.rack import RackEvidence, RackReadings, evidence_seen, rack_evidence, rack_readings
from policies.rules import Gates, NodeState, Verdict, transition
from policies.safety import (
    RACK_DOMAINS,
    BreakerState,
    ClusterView,
    Overrides,
    drain_withheld,
    jitter_s,
    resume_withheld,
    update_breaker,
)
from policies.settings import PolicySettings
from policies.tracking import Tracker
from policies.wording import node_detail

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
_OPEN: Final = Gates()  # what a node in service meets with no pin and no withheld drain
_SHOWN: Final = (Condition.WARNING, Condition.CRITICAL, Condition.UNKNOWN)


@dataclass(frozen=True, slots=True)
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

    @property
    def node(self) -> Assessment:
        """The node's assessment (built when first read)."""
        return self.node_view.assessment

    @property
    def gpus(self) -> tuple[Assessment, ...]:
        """Each GPU's assessment, in index order."""
        return tuple(g.assessment for g in self.gpu_views)


@dataclass(slots=True, eq=False)
class NodeView:
    """One node's assessment at one evaluation, built when first read, as a GPU's is.

    Its words (the hot GPU's, or why the node is unknown) are formatted from that
    evaluation's verdict and GPU views when someone reads them, not at every evaluation.
    """

    node: str
    at: float
    verdict: Verdict
    hot: GpuView | None  # the GPU the node's numbers are taken from
    gpus: tuple[GpuView, ...]
    note: str
    _assessment: Assessment | None = field(default=None, init=False, repr=False)

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
                detail=node_detail(verdict, hot, self.gpus, self.note),
            )
        return a


@dataclass(eq=False)
class Policy:
    """The predictive policy over the nodes of some racks; feed readings, then evaluate."""

    settings: PolicySettings  # replaced through reconfigure(), which reloads the trackers
    racks: Mapping[str, tuple[str, ...]]
    default_node: str | None = field(default=None, kw_only=True)
    rack_of: dict[str, str] = field(init=False)
    tracker: Tracker = field(init=False)
    states: dict[str, NodeState] = field(init=False)
    breaker: BreakerState = field(init=False, default_factory=BreakerState)
    # Per node: the GPU dict last seen and its keys in index order (see _gpus).
    _gpu_order: dict[str, tuple[dict[str, GpuTracker], list[str]]] = field(
        init=False, default_factory=dict
    )
    # Per rack: what it read at the last evaluation, read again only once it moved.
    _rack_readings: dict[str, RackReadings] = field(init=False, default_factory=dict)
    # The cap rung (policies/power_cap.py): None while [power_cap] is off.
    caps: CapLadder | None = field(init=False, default=None)
    cap_decisions: list[CapDecision] = field(init=False, default_factory=list)  # the last's

    def __post_init__(self) -> None:
        self.racks = {rack: tuple(nodes) for rack, nodes in self.racks.items()}
        self.rack_of = {n: r for r, nodes in self.racks.items() for n in nodes}
        self.tracker = Tracker(self.settings, self.racks, default_node=self.default_node)
        self.states = {n: NodeState() for n in self.rack_of}

    def reconfigure(self, new: PolicySettings) -> None:
        """Evaluate with ``new`` from now on (a reload); windows of another shape start afresh."""
        old = self.settings
        self.settings = new
        if any(getattr(old, f) != getattr(new, f) for f in _TRACKER_FIELDS):
            # Windows and fits of another shape: start them afresh; states stay.
            self.tracker = Tracker(new, self.racks, default_node=self.default_node)
        else:
            self.tracker.configure(new)

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
        out = action is not Action.RESUME
        self.states[node] = NodeState(
            action=action,
            since=now,
            epoch=old.epoch,
            domain=domain if out else FaultDomain.NONE,
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
        s = self.settings
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
            if any(g.condition in HOT for g in gpus[n]):
                trouble[rack] += 1
        evidence = {}
        for rk in {self.rack_of[n] for n in wanted}:
            last = self._rack_readings.get(rk)
            readings = rack_readings(rk, self.tracker.rack[rk], now, s, last)
            self._rack_readings[rk] = readings
            evidence[rk] = rack_evidence(rk, readings, now, margins[rk])
        if self.caps is not None:
            self.cap_decisions = self._caps(self.caps, now, wall, wanted, gpus, evidence, view)
        out = {}
        for n in wanted:
            rack = self.rack_of[n]
            out[n] = self._node(n, rack, gpus[n], evidence[rack], trouble[rack], now, wall, view, o)
        return out

    # -- one evaluation's parts ----------------------------------------------------

    def _caps(
        self,
        caps: CapLadder,
        now: float,
        wall: float,
        wanted: list[str],
        gpus: dict[str, list[GpuView]],
        evidence: dict[str, RackEvidence],
        view: ClusterView,
    ) -> list[CapDecision]:
        trackers = {n: self.tracker.nodes[n].gpus for n in wanted if n in self.tracker.nodes}
        references = {rk: self.tracker.rack[rk].reference(now) for rk in evidence}
        return caps.evaluate(
            now, wall, gpus, trackers, self.rack_of, evidence, references, self.settings,
            others_w=view.capped_w, breaker_open=self.breaker.open,
        )  # fmt: skip

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
            order = self._gpu_order[node] = (by_index, sorted(by_index, key=gpu_order))
        s = self.settings
        return [assess_gpu(i, by_index[i], now, reference, s) for i in order[1]]

    def _node(
        self,
        node: str,
        rack: str,
        gpus: list[GpuView],
        ev: RackEvidence,
        rack_trouble: int,
        now: float,
        wall: float,
        view: ClusterView,
        o: Overrides,
    ) -> Outcome:
        s = self.settings
        state = self.states.get(node, NodeState())
        if state.awaiting_evidence and evidence_seen(state.domain, ev):
            state = replace(state, awaiting_evidence=False)
        derated = self.caps is not None and self.caps.derated(node)
        judged, hot = judge_node(
            node, rack, state, gpus, ev, rack_trouble, view, s, derated=derated
        )
        if self.caps is not None and state.action is Action.RESUME:
            judged = held_by_cap(judged, gpus, self.caps.holds(node), s)
        pin = o.pins.get(node)
        in_service = state.action is Action.RESUME
        withheld = (
            drain_withheld(node, rack, judged.domain, view, s, self.breaker, o)
            if judged.condition is Condition.WARNING and in_service
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
        new_state, step, note = transition(state, judged, gates, now, s)
        self.states[node] = new_state
        views = tuple(gpus)
        node_view = NodeView(node, now, judged, hot, views, note)
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


def held_by_cap(
    judged: Verdict, gpus: list[GpuView], held: frozenset[str], s: PolicySettings
) -> Verdict:
    """A WARNING that only capped GPUs (holding, above the enter margin) raise: no drain
    while the cap holds (the first rung of the ladder stands in for it).

    Whatever the domain: a slow facility rise (coolant supply, inlet air) raises each
    GPU's reference, and a cap that holds every hot GPU answers it. A facility rule
    (a limit reached or forecast, lost flow, the signature), a leak or a followed peer
    is never held: no GPU cap moves the room or the loop.
    """
    if not held or judged.condition is not Condition.WARNING:
        return judged
    if not judged.gpu_thermal or judged.following:
        return judged
    for g in gpus:
        hot = g.condition in HOT or (
            g.full_load_margin is not None and g.full_load_margin < s.enter_margin_c
        )
        if hot and (g.subject not in held or g.margin is None or g.margin <= s.enter_margin_c):
            return judged
    return Verdict(Condition.OK, False, judged.domain, "")
