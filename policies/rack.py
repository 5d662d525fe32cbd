"""One rack's evidence at one evaluation: its cooling loop, its inlet air, and its assessment.

Read from the rack's tracker (policies/rack_tracker.py) again only once its readings or
their freshness moved (:class:`RackReadings`), completed with the nodes' margins once per
rack per evaluation, and shared by the rack's nodes; :mod:`policies.attribution` holds the
evidence's types and names the fault domain from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Generic, TypeVar

from policies import gradient
from policies.attribution import AirEvidence, LoopEvidence
from policies.freshness import absent, fresh_value
from policies.model import Assessment, Condition, FaultDomain, Reading, SensorKind
from policies.rack_tracker import RackStamp, RackTracker, SlowSeries
from policies.settings import PolicySettings
from policies.wording import minutes


@dataclass(frozen=True, slots=True)
class InletDerate:
    """A rack's inlet air against ``inlet_derate_limit_c``: the limit its equipment is rated
    for with power derated (an air-cooled part runs at inlet + R * P). Read once per rack
    readings; only the time to the derate limit moves with ``now`` (:meth:`at`)."""

    limit_c: float  # the inlet limit in force (ASHRAE A1 32 C by default)
    derate_c: float  # the inlet limit with power derated (e.g. A2 35 C)
    level_c: float | None  # the hottest fresh probe's held level
    probe: str = ""  # that probe's label
    rising: tuple[SlowSeries, ...] = ()  # fresh probes on a trusted rising trend
    # Every fresh probe's fitted slope, trusted or not, is at or under zero (and all are
    # fresh): the air has stopped warming, the derate's undo may start counting.
    settled: bool = False
    early_s: float | None = None  # the earliest trusted crossing of the derate limit

    def at(self, now: float) -> InletDerate:
        """The same at ``now``: the earliest time a rising probe reaches the derate limit."""
        times = [e for x in self.rising if (e := _limit_early(x, self.derate_c, now)) is not None]
        return replace(self, early_s=min(times, default=None))

    def ahead_c(self, lead_s: float) -> float | None:
        """The held level, or where a trusted rising trend takes it within ``lead_s``."""
        ahead = [
            lv + r * lead_s
            for x in self.rising
            if (lv := x.held_level()) is not None and (r := _rising_rate(x)) is not None
        ]
        if self.level_c is None:
            return max(ahead, default=None)
        return max([self.level_c, *ahead])

    @property
    def over(self) -> bool:
        """A probe's held level is at or above the derate limit."""
        return self.level_c is not None and self.level_c >= self.derate_c

    def within(self, horizon_s: float) -> bool:
        """At the derate limit, or forecast to reach it within ``horizon_s``."""
        return self.over or (self.early_s is not None and self.early_s <= horizon_s)

    def words(self) -> str:
        """The derate limit's evidence, as in a reason."""
        level = f"inlet {self.probe} {self.level_c or 0.0:.1f}C"
        if self.over:
            where = f"at or above its derate limit {self.derate_c:.0f}C"
        elif self.early_s is not None:
            where = f"derate limit {self.derate_c:.0f}C in ~{minutes(self.early_s)}"
        else:
            where = f"derate limit {self.derate_c:.0f}C"
        return f"{level}, {where} (power derated above its limit {self.limit_c:.0f}C)"


@dataclass(frozen=True, slots=True)
class RackEvidence:
    """What a rack's nodes share at one evaluation."""

    loop: LoopEvidence
    air: AirEvidence
    assessment: Assessment | None  # None: the rack reports nothing the policy reads
    derate: InletDerate | None = None  # None: no inlet_derate_limit_c for this rack


E = TypeVar("E", LoopEvidence, AirEvidence)


@dataclass(frozen=True, slots=True)
class HeldEvidence(Generic[E]):
    """Evidence read once from a rack's readings; only its time to a limit moves with ``now``."""

    steady: E  # as if no series were on its way to the limit
    what: str = ""  # the series' name in the words ("supply", "inlet")
    rising: tuple[SlowSeries, ...] = ()  # fresh series on a trusted rising trend
    head: tuple[str, ...] = ()  # the words before the time to the limit
    tail: tuple[str, ...] = ()  # and after it

    def at(self, now: float) -> E:
        """The evidence at ``now``: the earliest time a rising series reaches the limit."""
        steady = self.steady
        limit = steady.limit_c
        if limit is None:  # nothing read, so nothing rising
            return steady
        early: float | None = None
        for series in self.rising:
            e = _limit_early(series, limit, now)
            if e is not None and (early is None or e < early):
                early = e
        if early is None:
            return steady
        words: list[str] = list(self.head)
        if not steady.over_limit:
            words.append(f"{self.what} limit {limit:.0f}C in ~{minutes(early)}")
        return replace(steady, detail=", ".join([*words, *self.tail]), limit_early_s=early)


@dataclass(frozen=True, slots=True)
class RackReadings:
    """What a rack's evidence takes from its readings at one ``now``: all but the margins."""

    tracker: RackTracker
    settings: PolicySettings
    stamp: RackStamp
    loop: HeldEvidence[LoopEvidence]
    air: HeldEvidence[AirEvidence]
    supply: float | None  # the highest fresh coolant supply
    parts: tuple[str, ...]  # the inlet gradient's and the coolant dT's words
    derate: InletDerate | None = None  # the inlet against its derate limit, where one is set

    def hold(self, rt: RackTracker, now: float, s: PolicySettings) -> bool:
        """Reading ``rt`` with ``s`` at ``now`` would find all the same.

        Besides freshness and the cooling unit's silence (the stamp), ``now`` enters
        only the times to a limit, which :meth:`HeldEvidence.at` works out at each ``now``.
        """
        return rt is self.tracker and s is self.settings and rt.reads_as(self.stamp, now)


def rack_readings(
    rack: str, rt: RackTracker, now: float, s: PolicySettings, last: RackReadings | None = None
) -> RackReadings:
    """What ``rack`` reads at ``now``: ``last`` again if it still holds."""
    if last is not None and last.hold(rt, now, s):
        return last
    loop = _loop_read(rack, rt, now, s)
    air, probes = _air_read(rack, rt, now, s)
    supply = highest_fresh(rt, SensorKind.COOLANT_SUPPLY_TEMPERATURE, now, s)
    ret = highest_fresh(rt, SensorKind.COOLANT_RETURN_TEMPERATURE, now, s)
    parts = []
    grad = gradient.inlet_gradient(probes)
    if grad is not None:
        vertical = f", top-bottom {grad.vertical_c:+.1f}C" if grad.vertical_c is not None else ""
        range_ = f"spread {grad.spread_c:.1f}C{vertical}"
        parts.append(f"inlet {grad.hottest} {grad.hottest_c:.1f}C ({range_})")
    delta_t = gradient.coolant_delta_t(supply, ret)
    if delta_t is not None:
        parts.append(f"coolant dT {delta_t:.1f}C")
    derate = _derate_read(rack, rt, now, s)
    return RackReadings(rt, s, rt.stamp(now), loop, air, supply, tuple(parts), derate)


def rack_evidence(
    rack: str, readings: RackReadings, now: float, node_margins: Mapping[str, float]
) -> RackEvidence:
    """The evidence of ``rack`` at ``now``; ``node_margins``: each node's least GPU margin."""
    loop, air = readings.loop.at(now), readings.air.at(now)
    derate = readings.derate.at(now) if readings.derate is not None else None
    supply, s = readings.supply, readings.settings
    parts = list(readings.parts)
    spread = gradient.margin_spread(node_margins)
    if spread is not None:
        parts.append(f"GPU margin spread across nodes {spread:.1f}C")
    if loop.detail:
        parts.append(f"cooling loop: {loop.detail}")
    if air.detail:
        parts.append(air.detail)
    if not (loop.monitored or air.monitored or spread is not None):
        return RackEvidence(loop, air, None, derate)
    horizon = s.drain_horizon_s
    if air.over_limit:
        cond, domain = Condition.CRITICAL, FaultDomain.RACK
    elif loop.over_limit:
        cond, domain = Condition.CRITICAL, FaultDomain.COOLING_LOOP
    elif loop.failing or loop.limit_within(horizon):
        # Direct evidence, on fresh readings, whatever else is stale.
        cond, domain = Condition.WARNING, FaultDomain.COOLING_LOOP
    elif air.limit_within(horizon):
        cond, domain = Condition.WARNING, FaultDomain.RACK
    elif (loop.monitored and not loop.known) or (air.monitored and not air.known):
        cond, domain = Condition.UNKNOWN, FaultDomain.NONE
    elif loop.supply_rising:
        cond, domain = Condition.WARNING, FaultDomain.COOLING_LOOP
    elif air.rising:
        cond, domain = Condition.WARNING, FaultDomain.RACK
    else:
        cond, domain = Condition.OK, FaultDomain.NONE
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
    return RackEvidence(loop, air, a, derate)


def loop_evidence(rack: str, rt: RackTracker, now: float, s: PolicySettings) -> LoopEvidence:
    """The cooling loop of ``rack`` as its coolant, pump and leak series show it at ``now``."""
    return _loop_read(rack, rt, now, s).at(now)


def _loop_read(
    rack: str, rt: RackTracker, now: float, s: PolicySettings
) -> HeldEvidence[LoopEvidence]:
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
        return HeldEvidence(LoopEvidence())
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
        v is not None and v < 0.5 and (run := rt.runs.get(k)) is not None and run.confirmed(confirm)
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
    rising = []
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
            rising.append(sup)
    tail = []
    silent = rt.coolant_silent(now)
    if silent:
        tail.append("cooling unit not answering")
    if not known:
        tail.append("some coolant series stale or BAD")
    steady = LoopEvidence(
        True,
        known,
        leak,
        pump_lost or flow_confirmed,
        risen or rate is not None,
        rate,
        ", ".join([*words, *tail]),
        supply_risen=risen,
        silent=silent,
        limit_c=limit,
        over_limit=over,
    )
    return HeldEvidence(steady, "supply", tuple(rising), tuple(words), tuple(tail))


def air_evidence(
    rack: str, rt: RackTracker, now: float, s: PolicySettings
) -> tuple[AirEvidence, dict[str, float]]:
    """The inlet air of ``rack`` at ``now``, and each fresh probe's value by its label."""
    held, probes = _air_read(rack, rt, now, s)
    return held.at(now), probes


def _air_read(
    rack: str, rt: RackTracker, now: float, s: PolicySettings
) -> tuple[HeldEvidence[AirEvidence], dict[str, float]]:
    stale = s.rack_stale_after_s
    inlets = {k: x for k, x in rt.slow[SensorKind.INLET_TEMPERATURE].items() if not x.absent}
    if not inlets:
        return HeldEvidence(AirEvidence()), {}
    limit = s.inlet_limit(rack)
    probes: dict[str, float] = {}
    hottest: float | None = None
    known = True
    over = False
    rate: float | None = None
    rising = []
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
        if level is not None and (hottest is None or level > hottest):
            hottest = level
        if level is not None and level >= limit:
            over = True
            words.append(f"inlet {probe} {level:.1f}C at or above its limit {limit:.0f}C")
        r = _rising_rate(series)
        if r is not None:
            rising.append(series)
            if rate is None or r > rate:
                rate = r
    if rate is not None:
        words.append(f"inlet air rising {rate * 60:+.2f}C/min")
    tail = [] if known else ["some inlet probes stale or BAD"]
    detail = ", ".join([*words, *tail])
    steady = AirEvidence(True, known, rate, detail, limit, over, level_c=hottest)
    return HeldEvidence(steady, "inlet", tuple(rising), tuple(words), tuple(tail)), probes


def _derate_read(rack: str, rt: RackTracker, now: float, s: PolicySettings) -> InletDerate | None:
    """The inlet air against the rack's derate limit (None: none set, or no inlet probes)."""
    derate = s.inlet_derate_limit(rack)
    if derate is None:
        return None  # the common case: no inlet probe looked at
    inlets = _present(rt.slow[SensorKind.INLET_TEMPERATURE])
    if not inlets:
        return None
    level: float | None = None
    probe = ""
    rising = []
    settled = True
    for key, series in sorted(inlets, key=lambda kx: kx[0]):
        if fresh_value(series.latest, now, s.rack_stale_after_s) is None:
            settled = False
            continue
        assert series.latest is not None
        held = series.held_level()
        if held is not None and (level is None or held > level):
            level, probe = held, series.latest.labels.get("probe", key)
        if _rising_rate(series) is not None:
            rising.append(series)
        trend = series.forecaster.trend
        settled = settled and trend is not None and trend.slope <= 0.0
    return InletDerate(s.inlet_limit(rack), derate, level, probe, tuple(rising), settled)


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


def evidence_seen(domain: FaultDomain, ev: RackEvidence) -> bool:
    """The rack evidence for a rack-wide ``domain`` is all fresh now."""
    if domain is FaultDomain.COOLING_LOOP:
        return ev.loop.known
    if domain is FaultDomain.RACK:
        return ev.air.known
    return True


def highest_fresh(rt: RackTracker, kind: SensorKind, now: float, s: PolicySettings) -> float | None:
    """The highest fresh value of a kind (the worst of several supplies or returns)."""
    values = [
        v
        for series in rt.slow[kind].values()
        if (v := fresh_value(series.latest, now, s.rack_stale_after_s)) is not None
    ]
    return max(values) if values else None
