"""The cap rung of the ladder: lower a GPU's power limit before taking its node away.

Steady state: ``T = T_ref + R * P`` (policies/headroom.py). Per GPU at each evaluation:

* **Loop rung.** The rack's loop lost flow, or the GPU-only signature of a cooling
  failure fired (two or more GPUs of the rack heating fast at flat power): cap every
  GPU of the rack's evaluated nodes to its minimum limit, at once. The node rules
  still notify, drain and exclude on the same evidence: the cap only stretches the
  time they have (heating rate ~ P).
* **Margin rung.** A GPU whose forecast breach comes within twice the drain horizon,
  or whose margin is at or under the enter margin, with a fit resistance: cap to
  ``P_cap = (slowdown - cap_margin_c - T_ref) / R_hi`` (the conservative bound of R)
  when ``min_w <= P_cap`` and it binds (below the enforced limit). While the cap holds
  (the forecast turned, or it is younger than ``settle_s``) the node's predicted-only
  GPU-thermal drain is held back (:meth:`CapLadder.holds`), whatever cause it names
  (a slow supply or inlet rise raises T_ref); a facility limit's drain never is. It
  escalates (the drain goes ahead, the cap stays) when the forecast has not turned
  within ``settle_s`` or ``P_cap`` would be below the minimum.
* **Inlet rung** (``inlet_derate_limit_c`` set for the rack: the inlet air limit its
  equipment is rated for with power derated, e.g. A2 35 C). The inlet's held level at
  its limit, or its trusted forecast reaching it within twice the drain horizon: every
  GPU of the rack's evaluated nodes is derated (cause "inlet"), linearly from the limit
  before at the inlet limit to its minimum at the derate limit, in whole restore steps
  (:class:`_Inlet`). While every GPU of a node reads back an enforced limit at or under
  the step its inlet needs now (:meth:`CapLadder.derated`), the node's inlet drain uses
  the derate limit (policies/node.py); otherwise the inlet limit's, as without it.
* **Undo.** Healthy (margin at or above the exit margin, no forecast breach, no fast
  heating, flow present, the rack's supply and inlet not rising) for
  ``healthy_after_s`` (an inlet derate: the inlet also 2 C under its limit and settled):
  raise by ``restore_step_w`` every ``restore_every_s``, never
  above the limit enforced before rackguard capped. If the enforced limit is not
  rackguard's (an admin changed it), the cap is released without a set: left as
  found, said in the decision.
* **Refused.** A set the GPU refused (NVML ``NO_PERMISSION``, the helper down) is
  forgotten (:meth:`CapLadder.refused`): the node's drain goes ahead as without the
  cap, and the GPU is asked again only after a backoff, 10 s doubling to 5 min, not at
  every evaluation (no log line, decision row and helper request every second).
* **Fleet.** New caps are withheld while the capped watts (before - limit, summed over
  this ladder's GPUs and the fleet's other nodes, ``ClusterView.capped_w``) would
  exceed ``budget_w``, while more than ``storm_nodes`` nodes were newly capped within
  ``storm_window_s`` (one bad shared sensor must not cap a cluster), or while the
  storm breaker is open (a fleet's cap storm opens it: daemon/cluster/fleet.py).
  Lost flow measured by the cooling unit bypasses all three, as a critical exclusion
  bypasses the drain gates.

Pure: views, trackers and ``now`` in; decisions out. The caller applies them and
reports the limits it reads (:meth:`CapLadder.observe_limit`).
"""

from __future__ import annotations

import enum
import hashlib
import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Final

from policies.gpu import GpuView
from policies.gpu_tracker import GpuTracker
from policies.model import REASON_PREFIX, Condition
from policies.node import INLET_CLEAR_C
from policies.rack import InletDerate, RackEvidence
from policies.settings import PolicySettings
from policies.wording import minutes

_SAME_W = 1.0  # limits within a watt are the same limit (NVML reports milliwatts)
# The inlet rung: each derating step is set for the level this far ahead on the air's
# trusted trend, and at least DERATE_AHEAD_C above the level now (a slow rise's trend is
# not always trusted), so it is enforced before the level needs it: a step still being
# applied when the level needs it leaves the node at the inlet limit's rules.
DERATE_LEAD_S: Final = 60.0
DERATE_AHEAD_C: Final = 0.5
# Its undo starts counting healthy_after_s only with the inlet as far under its limit as
# a node needs to resume (policies/node.py).
DERATE_EXIT_C: Final = INLET_CLEAR_C
# A refused set is asked again after this, doubling per refusal in a row, up to the most.
REFUSED_RETRY_S: Final = 10.0
REFUSED_RETRY_MAX_S: Final = 300.0


class CapAction(enum.StrEnum):
    """What a cap decision asks of a GPU's power limit."""

    CAP = "cap"  # set a lower limit
    RESTORE = "restore"  # raise it (a step, or back to the limit before)
    RELEASE = "release"  # someone else changed the limit: forget the cap, set nothing


@dataclass(frozen=True, slots=True)
class CapSettings:
    """The ladder's numbers (the [power_cap] table)."""

    cap_margin_c: float = 8.0  # hold the GPU this far under slowdown
    settle_s: float = 120.0  # the forecast must turn within this
    healthy_after_s: float = 120.0  # healthy this long before the first restore step
    restore_step_w: float = 100.0
    restore_every_s: float = 30.0
    budget_w: float = 1.0e6  # cluster-wide capped watts
    storm_nodes: int = 8  # more nodes newly capped than this within storm_window_s
    storm_window_s: float = 600.0


@dataclass(frozen=True, slots=True)
class GpuLimits:
    """NVML's constraints of one GPU, in watts."""

    min_w: float
    max_w: float


@dataclass(frozen=True, slots=True)
class CapState:
    """rackguard's own cap on one GPU: durable (the decision store keeps it)."""

    node: str
    gpu: str
    limit_w: float
    before_w: float  # the limit enforced before rackguard capped: never restored above
    since: float  # monotonic: when the cap (or its last tightening) was set
    cause: str  # "margin", "loop" or "inlet"
    escalated: bool = False
    healthy_since: float | None = None
    last_step: float = 0.0
    # The limit before rackguard's latest set, and when it was decided: until the
    # limit reading shows the new one (the applier and the NVML poll take a pass or
    # two), reading the old one is not someone else's change.
    was_w: float | None = None
    changed_at: float = 0.0


@dataclass(frozen=True, slots=True)
class CapDecision:
    """A change to one GPU's power limit, with why."""

    node: str
    gpu: str
    action: CapAction
    watts: float  # the limit to set (RELEASE: the limit found)
    before_w: float
    reason: str
    at: float  # wall time
    key: str
    dry_run: bool = False


@dataclass(slots=True, eq=False)
class CapLadder:
    """The cap rung over every GPU a Policy evaluates."""

    settings: CapSettings = field(default_factory=CapSettings)
    states: dict[tuple[str, str], CapState] = field(default_factory=dict)
    limits: dict[tuple[str, str], GpuLimits] = field(default_factory=dict)
    released: list[CapDecision] = field(default_factory=list)  # admin-changed, for the log
    # Caps only recorded ([power_cap] dry_run): the enforced limit never becomes the
    # cap, so it is not read as someone else's change. None: the policy's dry_run.
    dry_run: bool | None = None
    _capped_at: deque[tuple[float, str]] = field(default_factory=deque)
    _epoch: int = 0
    _others_w: float = 0.0  # the fleet's other nodes' capped watts, at this evaluation
    _breaker_open: bool = False
    _derated: set[str] = field(default_factory=set)  # nodes whose inlet derate is enforced
    # Per GPU whose latest set was refused: (not asked again before, refusals in a row).
    _refused: dict[tuple[str, str], tuple[float, int]] = field(default_factory=dict)

    def observe_limit(self, node: str, gpu: str, min_w: float, max_w: float) -> None:
        """NVML's constraints of a GPU (read by the caller, e.g. at each poll)."""
        self.limits[(node, gpu)] = GpuLimits(min_w, max_w)

    def restore(self, state: CapState) -> None:
        """Adopt a cap recorded earlier (a restart): neither capped again nor forgotten."""
        self.states[(state.node, state.gpu)] = state

    def refused(self, node: str, gpu: str, now: float, *, permanent: bool = False) -> float:
        """The set of this GPU's latest cap was refused: forget the cap (the node's drain
        goes ahead) and ask again only after a backoff, the longest at once when the
        refusal is permanent. Returns the wait in seconds."""
        self.states.pop((node, gpu), None)
        count = self._refused.get((node, gpu), (0.0, 0))[1] + 1
        wait = min(REFUSED_RETRY_MAX_S, REFUSED_RETRY_S * 2.0 ** min(count - 1, 30))
        wait = REFUSED_RETRY_MAX_S if permanent else wait
        self._refused[(node, gpu)] = (now + wait, count)
        return wait

    def refused_until(self, node: str, gpu: str) -> float | None:
        """When a GPU whose latest set was refused is asked again (None: not refused)."""
        got = self._refused.get((node, gpu))
        return got[0] if got is not None else None

    def applied(self, node: str, gpu: str) -> None:
        """A set of this GPU's limit went through: a later refusal backs off from the start."""
        self._refused.pop((node, gpu), None)

    def holds(self, node: str) -> frozenset[str]:
        """The GPUs of ``node`` (subjects) whose margin cap stands in for a drain now."""
        return frozenset(
            "gpu" + st.gpu
            for st in self.states.values()
            if st.node == node and st.cause == "margin" and not st.escalated
        )

    def derated(self, node: str) -> bool:
        """Every GPU of ``node`` is held, by a limit read back as enforced, at or under the
        inlet rung's step for its rack's inlet now: its inlet drain may use the derate limit.
        As of the latest :meth:`evaluate`; never in dry_run (nothing is enforced)."""
        return node in self._derated

    def capped_w(self, node: str | None = None) -> float:
        """Watts given up to this ladder's caps (of ``node`` only, when given)."""
        return sum(
            st.before_w - st.limit_w
            for st in self.states.values()
            if node is None or st.node == node
        )

    def evaluate(
        self,
        now: float,
        wall: float,
        views: Mapping[str, list[GpuView]],
        trackers: Mapping[str, Mapping[str, GpuTracker]],
        rack_of: Mapping[str, str],
        evidence: Mapping[str, RackEvidence],
        references: Mapping[str, float | None],
        s: PolicySettings,
        *,
        others_w: float = 0.0,
        breaker_open: bool = False,
    ) -> list[CapDecision]:
        """The cap decisions at ``now`` for the nodes in ``views``; ``others_w``: the
        fleet's other nodes' capped watts; ``breaker_open``: the storm breaker's state."""
        self._others_w, self._breaker_open = others_w, breaker_open
        # Per rack, each fast-heating GPU's rate per watt (C/s/W): heat removal failing
        # heats every GPU of the loop at a rate ~ its power, so the ratios agree.
        per_watt: dict[str, list[float]] = {}
        for node, gpus in views.items():
            rates = per_watt.setdefault(rack_of[node], [])
            for g in gpus:
                t = trackers.get(node, {}).get(g.subject.removeprefix("gpu"))
                power = t.fresh_power(now, s.stale_after_s) if t is not None else None
                if g.fast_heating_c_per_s is not None and power is not None and power > 0.0:
                    rates.append(g.fast_heating_c_per_s / power)
        fast = {rack: _common_cause(rates) for rack, rates in per_watt.items()}
        while self._capped_at and self._capped_at[0][0] < now - self.settings.storm_window_s:
            self._capped_at.popleft()
        inlets = {
            rack: inlet
            for rack, ev in evidence.items()
            if (inlet := _Inlet.of(rack, ev, s)) is not None
        }
        out: list[CapDecision] = []
        for node, gpus in views.items():
            rack = rack_of[node]
            ev = evidence.get(rack)
            loop = ev.loop if ev is not None else None
            flow_lost = loop is not None and loop.flow_lost
            # What the GPUs reject heat to still warming: a restore step now would be
            # undone by the rise (cap, restore, cap ... while the supply or air climbs).
            warming = ev is not None and (ev.loop.supply_rising or ev.air.rising)
            signature = fast.get(rack, 0) >= 2
            cause = ""
            if flow_lost:
                cause = f"cooling loop of {rack} lost flow"
            elif signature:
                cause = f"{fast[rack]} GPUs of {rack} heating fast at flat power, cooling failing"
            for g in gpus:
                gpu = g.subject.removeprefix("gpu")
                t = trackers.get(node, {}).get(gpu)
                if t is None:
                    continue
                d = self._gpu(
                    node, gpu, g, t, references.get(rack), cause, flow_lost, warming,
                    inlets.get(rack), now, s,
                )  # fmt: skip
                if d is not None:
                    out.append(self._stamp(d, wall, s))
        self._derated = {
            node
            for node, gpus in views.items()
            if self._enforced(node, gpus, trackers.get(node, {}), inlets.get(rack_of[node]), now, s)
        }
        return out

    def _enforced(
        self,
        node: str,
        gpus: list[GpuView],
        trackers: Mapping[str, GpuTracker],
        inlet: _Inlet | None,
        now: float,
        s: PolicySettings,
    ) -> bool:
        """Whether the inlet derate of ``node`` is in force (see :meth:`derated`)."""
        dry = self.dry_run if self.dry_run is not None else s.dry_run
        if inlet is None or dry or not gpus:
            return False
        for g in gpus:
            gpu = g.subject.removeprefix("gpu")
            st, lim, t = (
                self.states.get((node, gpu)),
                self.limits.get((node, gpu)),
                trackers.get(gpu),
            )
            enforced = t.fresh_limit(now, s.stale_after_s) if t is not None else None
            if st is None or lim is None or enforced is None:
                return False
            # The step the level now needs (the first step while still under the limit),
            # not the one set ahead of it: a step decided this evaluation and not yet read
            # back leaves the one before, which covers the level now.
            if enforced > inlet.step_w(lim, st.before_w, self.settings, ahead=False) + _SAME_W:
                return False
        return True

    # -- one GPU -------------------------------------------------------------------

    def _gpu(
        self,
        node: str,
        gpu: str,
        g: GpuView,
        t: GpuTracker,
        reference: float | None,
        loop_cause: str,
        measured: bool,
        warming: bool,
        inlet: _Inlet | None,
        now: float,
        s: PolicySettings,
    ) -> CapDecision | None:
        key = (node, gpu)
        st = self.states.get(key)
        lim = self.limits.get(key)
        enforced = t.fresh_limit(now, s.stale_after_s)
        if lim is None or enforced is None:
            return None
        dry = self.dry_run if self.dry_run is not None else s.dry_run
        if (
            st is not None
            and not dry
            and abs(enforced - st.limit_w) > _SAME_W
            and not _pending(st, enforced, now, s)
        ):
            del self.states[key]
            why = (
                f"{REASON_PREFIX} {g.subject} of {node}: enforced limit {enforced:.0f}W is not "
                f"rackguard's {st.limit_w:.0f}W (changed by another actor); left as found"
            )
            d = CapDecision(node, gpu, CapAction.RELEASE, enforced, st.before_w, why, 0.0, "")
            self.released.append(d)
            return d
        if st is None and now < self._refused.get(key, (-math.inf, 0))[0]:
            return None  # its latest set was refused: asked again after the backoff
        if loop_cause:
            if st is not None and st.limit_w <= lim.min_w + _SAME_W:
                self.states[key] = replace(st, healthy_since=None)
                return None
            if not measured and self._withheld(node, st, enforced - lim.min_w):
                return None
            why = (
                f"{REASON_PREFIX} {loop_cause}: {g.subject} of {node} capped to its minimum "
                f"{lim.min_w:.0f}W (heating rate ~ power) ahead of the drain"
            )
            return self._cap(node, gpu, st, lim.min_w, enforced, now, "loop", why)
        if inlet is not None and inlet.wanted:
            derate = self._inlet(node, gpu, g, st, lim, enforced, inlet, now)
            if derate is not None:
                return derate
            st = self.states.get(key)
        if g.margin is None or g.threshold is None:
            return None
        danger = g.at_risk or g.condition in (Condition.WARNING, Condition.CRITICAL)
        if danger:
            return self._margin(node, gpu, g, t, st, lim, enforced, reference, now, s)
        if st is None:
            return None
        healthy = g.margin >= s.exit_margin_c and g.fast_heating_c_per_s is None and not warming
        if inlet is not None:
            # An inlet derate is undone only once the air is back under its limit by a
            # margin and has stopped warming; no other cap is raised past a step it needs.
            healthy = healthy and (inlet.undo if st.cause == "inlet" else not inlet.wanted)
        if not healthy:
            self.states[key] = replace(st, healthy_since=None)
            return None
        since = st.healthy_since if st.healthy_since is not None else now
        st = replace(st, healthy_since=since)
        self.states[key] = st
        c = self.settings
        if now - since < c.healthy_after_s or now - st.last_step < c.restore_every_s:
            return None
        new = min(st.before_w, st.limit_w + c.restore_step_w)
        if not self._holds_at(g, t, reference, new, now, s):
            return None  # R now says the step would bring it back near slowdown
        if new >= st.before_w - _SAME_W:
            del self.states[key]
            words = f"restored to {st.before_w:.0f}W, the limit before rackguard capped"
        else:
            self.states[key] = replace(
                st, limit_w=new, last_step=now, was_w=st.limit_w, changed_at=now
            )
            words = f"raised to {new:.0f}W (of {st.before_w:.0f}W before the cap)"
        why = (
            f"{REASON_PREFIX} {g.subject} of {node} healthy for {now - since:.0f}s: "
            f"power limit {words}"
        )
        return CapDecision(node, gpu, CapAction.RESTORE, new, st.before_w, why, 0.0, "")

    def _inlet(
        self,
        node: str,
        gpu: str,
        g: GpuView,
        st: CapState | None,
        lim: GpuLimits,
        enforced: float,
        inlet: _Inlet,
        now: float,
    ) -> CapDecision | None:
        """Derate the GPU to the inlet rung's step (only ever tighter while it is wanted)."""
        key = (node, gpu)
        before = st.before_w if st is not None else enforced
        target = inlet.step_w(lim, before, self.settings, ahead=True)
        if st is not None and st.limit_w <= target + _SAME_W:
            self.states[key] = replace(st, healthy_since=None)
            return None
        if st is None and target >= enforced - _SAME_W:
            return None  # a limit already at or under the step is not rackguard's to derate
        if self._withheld(node, st, (st.limit_w if st is not None else enforced) - target):
            return None
        why = (
            f"{REASON_PREFIX} {inlet.words()}: {g.subject} of {node} derated to "
            f"{target:.0f}W (linear from {before:.0f}W at {inlet.ev.limit_c:.0f}C "
            f"to its minimum {lim.min_w:.0f}W at {inlet.ev.derate_c:.0f}C)"
        )
        return self._cap(node, gpu, st, target, enforced, now, "inlet", why)

    def _margin(
        self,
        node: str,
        gpu: str,
        g: GpuView,
        t: GpuTracker,
        st: CapState | None,
        lim: GpuLimits,
        enforced: float,
        reference: float | None,
        now: float,
        s: PolicySettings,
    ) -> CapDecision | None:
        assert g.threshold is not None
        key = (node, gpu)
        target = self._target(g, t, st, reference, now, s)
        if st is not None:
            st = replace(st, healthy_since=None)
            turned = g.fall_c_per_s is None and not g.predicted
            if (
                g.margin is not None
                and g.margin <= s.enter_margin_c
                and st.limit_w > lim.min_w + _SAME_W
            ):
                # The cap did not hold the margin: the drain goes ahead, and the GPU
                # gets the most time its minimum limit can buy.
                why = (
                    f"{REASON_PREFIX} {g.subject} of {node} {g.margin:.1f}C under slowdown "
                    f"despite its cap: capped to its minimum {lim.min_w:.0f}W, draining"
                )
                d = self._cap(node, gpu, st, lim.min_w, enforced, now, "margin", why)
                self.states[key] = replace(self.states[key], escalated=True)
                return d
            if target is None or target < lim.min_w:
                st = replace(st, escalated=True)
            elif (
                target < st.limit_w - _SAME_W
                and not st.escalated
                and now - st.since >= self.settings.restore_every_s
            ):
                why = (
                    f"{REASON_PREFIX} {g.subject} of {node} still heading for slowdown: "
                    f"cap tightened to {target:.0f}W"
                )
                return self._cap(node, gpu, st, target, enforced, now, "margin", why)
            elif not turned and now - st.since > self.settings.settle_s:
                st = replace(st, escalated=True)
            self.states[key] = st
            return None
        if target is None or target < lim.min_w or target >= enforced - _SAME_W:
            return None  # no cap holds it (or none is needed by R): the drain decides
        if self._withheld(node, None, enforced - target):
            return None
        why = (
            f"{REASON_PREFIX} {g.subject} of {node} forecast to reach slowdown "
            f"{g.threshold:.0f}C: capped to {target:.0f}W to hold it "
            f"{self.settings.cap_margin_c:.0f}C under (reference {reference or 0:.1f}C), "
            "rather than drain"
        )
        return self._cap(node, gpu, None, target, enforced, now, "margin", why)

    def _target(
        self,
        g: GpuView,
        t: GpuTracker,
        st: CapState | None,
        reference: float | None,
        now: float,
        s: PolicySettings,
    ) -> float | None:
        """The limit that holds ``g`` at slowdown - cap_margin_c (None: R unknown).

        R is the largest of the fit's upper bound, the ratio now (a GPU heating at its
        power reads below its steady temperature: the ratio bounds R from below) and,
        where the forecast still falls (first cap, or a cap older than a restore step),
        the R at which the GPU would reach slowdown at its present power: a forecast
        breach at steady power is R rising (a plate failing, its coolant warming).
        """
        assert g.threshold is not None and g.value is not None
        est = t.resistance.estimate(s.trend_min_points)
        power = t.fresh_power(now, s.stale_after_s)
        if est is None or reference is None or power is None or power <= 0.0:
            return None
        rise = g.threshold - reference
        if rise <= self.settings.cap_margin_c:
            return None
        r = max(est.hi, (g.value - reference) / power)
        falling = g.fall_c_per_s is not None or g.predicted
        if falling and (st is None or now - st.since >= self.settings.restore_every_s):
            r = max(r, rise / power)
        return (rise - self.settings.cap_margin_c) / r

    def _holds_at(
        self,
        g: GpuView,
        t: GpuTracker,
        reference: float | None,
        watts: float,
        now: float,
        s: PolicySettings,
    ) -> bool:
        """Whether ``watts`` keeps ``g`` at slowdown - cap_margin_c by R now (conservative)."""
        est = t.resistance.estimate(s.trend_min_points)
        power = t.fresh_power(now, s.stale_after_s)
        if reference is None or power is None or power <= 0.0 or g.value is None:
            return False
        r = (g.value - reference) / power
        if est is not None:
            r = max(r, est.hi)
        assert g.threshold is not None
        return reference + r * watts <= g.threshold - self.settings.cap_margin_c

    def _withheld(self, node: str, st: CapState | None, more_w: float) -> str:
        """Why a new cap may not be set now ("" = it may)."""
        c = self.settings
        if self._breaker_open:
            return "storm breaker open"
        if st is None and self.capped_w() + self._others_w + more_w > c.budget_w:
            return f"cap budget of {c.budget_w:.0f}W reached"
        nodes = {n for _, n in self._capped_at}
        if node not in nodes and len(nodes) >= c.storm_nodes:
            return f"cap storm: {len(nodes)} nodes capped within {c.storm_window_s:.0f}s"
        return ""

    def _cap(
        self,
        node: str,
        gpu: str,
        st: CapState | None,
        watts: float,
        enforced: float,
        now: float,
        cause: str,
        why: str,
    ) -> CapDecision:
        before = st.before_w if st is not None else enforced
        was = st.limit_w if st is not None else enforced
        self.states[(node, gpu)] = CapState(
            node, gpu, watts, before, now, cause, last_step=now, was_w=was, changed_at=now
        )
        self._capped_at.append((now, node))
        return CapDecision(node, gpu, CapAction.CAP, watts, before, why, 0.0, "")

    def _stamp(self, d: CapDecision, wall: float, s: PolicySettings) -> CapDecision:
        self._epoch += 1
        raw = f"{d.node}|{d.gpu}|{d.action.value}|{d.watts:.1f}|{wall:.3f}|{self._epoch}"
        key = "rgc-" + hashlib.sha256(raw.encode()).hexdigest()[:24]
        dry = self.dry_run if self.dry_run is not None else s.dry_run
        return replace(d, at=wall, key=key, dry_run=dry)


def _pending(st: CapState, enforced: float, now: float, s: PolicySettings) -> bool:
    """The limit read is the one before rackguard's latest set, decided moments ago."""
    return (
        st.was_w is not None
        and abs(enforced - st.was_w) <= _SAME_W
        and now - st.changed_at <= 3 * s.stale_after_s
    )


_SPREAD: Final = 4.0  # rates per watt within this factor: one cause (power-proportional)


def _common_cause(per_watt: list[float]) -> int:
    """How many fast-heating GPUs share the power-proportional rate of the median one."""
    if len(per_watt) < 2:
        return len(per_watt)
    mid = sorted(per_watt)[len(per_watt) // 2]
    return sum(mid / _SPREAD <= r <= mid * _SPREAD for r in per_watt)


@dataclass(frozen=True, slots=True)
class _Inlet:
    """One rack's inlet rung at one evaluation (its ``inlet_derate_limit_c`` set).

    Wanted: the held level at or over the inlet limit, or its trusted forecast reaching it
    within twice the drain horizon (the same look-ahead as the margin rung): the derate
    must be enforced before the limit's own drain (forecast within the drain horizon)
    would go ahead. The step: linear in the inlet from the limit enforced before the cap
    at the inlet limit to the GPU's minimum at the derate limit, rounded down to whole
    ``restore_step_w`` below it (at least one), never under the minimum.
    """

    rack: str
    ev: InletDerate
    limit_early_s: float | None  # the trusted forecast crossing of the inlet limit
    wanted: bool
    undo: bool  # under the limit by DERATE_EXIT_C, every probe settled, not wanted

    @staticmethod
    def of(rack: str, ev: RackEvidence, s: PolicySettings) -> _Inlet | None:
        d = ev.derate
        if d is None or d.level_c is None:
            return None
        early = ev.air.limit_early_s
        wanted = d.level_c >= d.limit_c or (early is not None and early <= 2 * s.drain_horizon_s)
        undo = not wanted and d.settled and d.level_c <= d.limit_c - DERATE_EXIT_C
        return _Inlet(rack, d, early, wanted, undo)

    def step_w(self, lim: GpuLimits, before: float, c: CapSettings, *, ahead: bool) -> float:
        """The derating step for the level now (``ahead``: DERATE_LEAD_S ahead)."""
        d = self.ev
        level = d.ahead_c(DERATE_LEAD_S) if ahead else d.level_c
        if ahead and level is not None and d.level_c is not None:
            level = max(level, d.level_c + DERATE_AHEAD_C)
        span = d.derate_c - d.limit_c
        frac = min(1.0, max(0.0, ((level or d.limit_c) - d.limit_c) / span))
        steps = max(1, math.ceil((before - lim.min_w) * frac / c.restore_step_w - 1e-9))
        return max(lim.min_w, before - steps * c.restore_step_w)

    def words(self) -> str:
        """Why the rack's GPUs are derated, in a reason."""
        d = self.ev
        level = f"inlet air of {self.rack} {d.level_c or 0.0:.1f}C ({d.probe})"
        if (d.level_c or 0.0) >= d.limit_c:
            where = f"at or above its limit {d.limit_c:.0f}C"
        else:
            early = minutes(self.limit_early_s or 0.0)
            where = f"forecast to reach its limit {d.limit_c:.0f}C in ~{early}"
        return f"{level} {where}, derate limit {d.derate_c:.0f}C"
