"""Fault-domain attribution: which of one GPU, one node, the rack or the cooling loop is failing.

The decision's domain sets its scope: a GPU or node fault drains that node only;
a rack (inlet air) or cooling-loop fault is shared by every node of the rack,
and each of the rack's agents drains its own node for it.

Order of evidence (first match wins):

1. Cooling loop, direct evidence: a leak or lost flow (pump stopped with no
   normal flow, or flow well under its sustained high).
2. Cooling loop, shared warming: coolant supply rising at least half as fast as
   the GPU margins fall, or (with no rate to compare) a material supply rise over
   the window; only when the trouble is broad.
3. Rack: inlet air rising at least half as fast as the margins fall (broad
   trouble only), or (when the policy sees the rack's other nodes) two or more
   nodes of the rack in trouble.
4. Node: two or more of its GPUs in trouble.
5. GPU: one GPU (its cold plate, its paste, its fan).

*Broad* means two or more GPUs of the node, or two or more nodes of the rack, in
trouble: one hot GPU is that GPU's problem, whatever a shared series does. A
shared trend explains a decline only when the decline is known: with no trusted
margin trend, a rate alone explains nothing.

Evidence that is UNKNOWN (stale or BAD) cannot name a domain: the attribution
falls through to the next rule, and says so in its explanation.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.model import FaultDomain

# Shared evidence explains a GPU margin decline when it moves at least this fraction as fast.
EXPLAINS_FRACTION = 0.5


@dataclass(frozen=True, slots=True)
class LoopEvidence:
    """The cooling loop (CDU) as one rack's series show it."""

    monitored: bool = False  # the rack has reported coolant series at least once
    known: bool = False  # every monitored coolant series is fresh
    leak: bool = False
    # Pump stopped with no normal flow (or every pump stopped), or flow under the low
    # fraction of its sustained high, confirmed by two fresh samples flow_loss_confirm_s
    # apart (a blip that recovers within the window is not lost flow).
    flow_lost: bool = False
    supply_rising: bool = False  # supply well above its window minimum, or trending up
    supply_rate_c_per_s: float | None = None  # a trusted, significant supply trend
    detail: str = ""
    # The newest supply bucket mean is at least supply_rise_c above the window's lowest.
    supply_risen: bool = False
    silent: bool = False  # the cooling unit has missed its last polls
    limit_c: float | None = None  # the supply limit in force
    over_limit: bool = False  # the supply's held level is at or above the limit
    limit_early_s: float | None = None  # earliest plausible crossing of the limit (trusted)

    @property
    def failing(self) -> bool:
        """A leak or lost flow: the loop cannot carry the heat away."""
        return self.leak or self.flow_lost

    @property
    def current(self) -> bool:
        """The loop is being watched now: every series fresh and the unit answering."""
        return self.monitored and self.known and not self.silent

    def limit_within(self, horizon_s: float) -> bool:
        """The supply is at its limit or forecast to cross it within ``horizon_s``."""
        return self.over_limit or (
            self.limit_early_s is not None and self.limit_early_s <= horizon_s
        )

    @property
    def healthy(self) -> bool:
        """Known, and neither failing, warming nor at its limit."""
        return self.known and not self.failing and not self.supply_rising and not self.over_limit


@dataclass(frozen=True, slots=True)
class AirEvidence:
    """The rack's inlet air as its probes show it."""

    monitored: bool = False
    known: bool = False
    rate_c_per_s: float | None = None  # the hottest probe's trusted rising trend
    detail: str = ""
    limit_c: float | None = None  # the inlet limit in force
    over_limit: bool = False  # a probe's held level is at or above the limit
    limit_early_s: float | None = None  # earliest plausible crossing of the limit (trusted)
    level_c: float | None = None  # the hottest fresh probe's held level

    @property
    def rising(self) -> bool:
        """The inlet air is warming (trusted trend)."""
        return self.rate_c_per_s is not None and self.rate_c_per_s > 0

    def limit_within(self, horizon_s: float) -> bool:
        """The air is at its limit or forecast to cross it within ``horizon_s``."""
        return self.over_limit or (
            self.limit_early_s is not None and self.limit_early_s <= horizon_s
        )

    @property
    def healthy(self) -> bool:
        """Known, not warming, and under its limit."""
        return self.known and not self.rising and not self.over_limit


def _explains(rate: float | None, margin_fall_c_per_s: float | None) -> bool:
    """A shared series moving at ``rate`` explains a known margin decline."""
    if rate is None or rate <= 0:
        return False
    if margin_fall_c_per_s is None or margin_fall_c_per_s <= 0:
        return False
    return rate >= EXPLAINS_FRACTION * margin_fall_c_per_s


def _supply_explains(loop: LoopEvidence, margin_fall_c_per_s: float | None) -> bool:
    if _explains(loop.supply_rate_c_per_s, margin_fall_c_per_s):
        return True
    # A material rise, with no rate or no decline to compare it with, is evidence too.
    unmatched = loop.supply_rate_c_per_s is None or margin_fall_c_per_s is None
    return loop.supply_risen and unmatched


def attribute(
    *,
    hot_gpus: int,
    loop: LoopEvidence,
    air: AirEvidence,
    margin_fall_c_per_s: float | None,
    rack_nodes_in_trouble: int,
) -> tuple[FaultDomain, str]:
    """The domain of a node's trouble and a few words on why.

    ``margin_fall_c_per_s`` is how fast the node's worst GPU margin falls (None when
    it has no trusted trend); ``rack_nodes_in_trouble`` counts the nodes of the rack
    the caller sees in trouble, this one included.
    """
    broad = hot_gpus >= 2 or rack_nodes_in_trouble >= 2
    if loop.known:
        if loop.failing:
            return FaultDomain.COOLING_LOOP, loop.detail
        if broad and _supply_explains(loop, margin_fall_c_per_s):
            return FaultDomain.COOLING_LOOP, loop.detail
    if broad and air.known and _explains(air.rate_c_per_s, margin_fall_c_per_s):
        return FaultDomain.RACK, air.detail
    if rack_nodes_in_trouble >= 2:
        return FaultDomain.RACK, f"{rack_nodes_in_trouble} nodes of the rack affected"
    unknown = []
    if loop.monitored and not loop.known:
        unknown.append("cooling loop")
    if air.monitored and not air.known:
        unknown.append("inlet air")
    note = f" ({' and '.join(unknown)} unknown)" if unknown else ""
    if hot_gpus >= 2:
        return FaultDomain.NODE, f"{hot_gpus} GPUs of the node affected{note}"
    return FaultDomain.GPU, f"one GPU affected{note}"
