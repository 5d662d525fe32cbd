"""Scoring decisions against a scenario's ground truth: lead times and false drains.

Shared by the bench's scenario table (bench/scoring.py) and `rackguard-sim score`:

* onset: the fault's start (the first event other than a job start, stop or
  power cap, or the first fault applied through the harness);
* crossing: the first GPU reading at or above its slowdown temperature;
* drain: the first drain or exclusion of the last expected node to be acted on;
* lead: crossing minus that drain (the worst node's);
* false drains: nodes acted on that the scenario's ``[expect]`` does not list;
* throttled GPU-seconds in service: how long GPUs ran throttled (heat or power
  brake) on nodes not yet drained — work slowed that rackguard exists to spare.
  The outcome number; target 0.

When a scheduler recorded what it applied (``rackguard-sim serve --scheduler``)
the drains are the ones it applied, and every decision of the daemon's log that
it never applied fails the run (:func:`never_applied`).
"""

from __future__ import annotations

import collections
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from fakes.sim.scenario import EventKind, Scenario
from policies.model import Reading, SensorKind

LOAD_EVENTS = (EventKind.JOB_START, EventKind.JOB_STOP, EventKind.POWER_CAP)
ACTIONS = ("drain", "exclude")  # what counts as taking a node out


def onset(scenario: Scenario) -> float | None:
    """When the scenario's first fault starts (None: no fault in its timeline)."""
    faults = [e.at_s for e in scenario.events if e.kind not in LOAD_EVENTS]
    return min(faults) if faults else None


def first_crossing(scenario: Scenario, readings: Iterable[Reading]) -> float | None:
    """The time of the first usable GPU reading at or above the model's slowdown temperature."""
    slowdown = scenario.rack.model.slowdown_c
    for r in readings:
        hot = r.value is not None and r.value >= slowdown
        if r.kind is SensorKind.GPU_TEMPERATURE and r.usable and hot:
            return r.mono
    return None


def throttled_in_service(
    scenario: Scenario, readings: Iterable[Reading], first_action: Mapping[str, float]
) -> float:
    """GPU-seconds at or above slowdown (the simulator's thermal slowdown) before each
    node's first drain, from a trace's GPU temperatures (each counts until the next)."""
    slowdown = scenario.rack.model.slowdown_c
    last: dict[tuple[str, str], tuple[float, bool]] = {}
    total = 0.0
    for r in readings:
        if r.kind is not SensorKind.GPU_TEMPERATURE:
            continue
        node = r.labels.get("node", "")
        gpu = (node, r.labels.get("gpu", r.sensor))
        hot = r.usable and r.value is not None and r.value >= slowdown
        before = last.get(gpu)
        if before is not None and before[1] and before[0] < first_action.get(node, math.inf):
            total += max(0.0, min(r.mono, first_action.get(node, math.inf)) - before[0])
        last[gpu] = (r.mono, hot)
    return total


def first_actions(decisions: Iterable[tuple[float, str, str]]) -> dict[str, float]:
    """Each node's first drain or exclusion time, from (t, node, action) in any order."""
    first: dict[str, float] = {}
    for t, node, action in sorted(decisions):
        if action in ACTIONS:
            first.setdefault(node, t)
    return first


def never_applied(
    decided: Iterable[tuple[float, str, str]], applied: Iterable[tuple[float, str, str]]
) -> list[tuple[float, str, str]]:
    """The decisions (t, node, action) the scheduler has no record of applying, oldest first.

    Matched by node and action: the n-th drain of a node is applied when the
    scheduler applied at least n drains of it.
    """
    taken = collections.Counter((node, action) for _, node, action in applied)
    seen: collections.Counter[tuple[str, str]] = collections.Counter()
    missing = []
    for t, node, action in sorted(decided):
        seen[node, action] += 1
        if seen[node, action] > taken[node, action]:
            missing.append((t, node, action))
    return missing


@dataclass
class DecisionScore:
    """What a run's decisions give against its ground truth (times in simulated seconds)."""

    name: str
    onset_s: float | None
    crossing_s: float | None
    first_action_s: Mapping[str, float]
    expected: tuple[str, ...]
    judged_on: str = "the decision log"
    # Decisions the daemon made that the scheduler never applied: (t, node, action).
    unapplied: tuple[tuple[float, str, str], ...] = ()
    # GPU-seconds throttled on nodes still in service (None: not measured).
    throttled_gpu_s: float | None = None
    invalid: str = ""  # why the run's host could not keep its speed ("" when it did)

    @property
    def false_drains(self) -> int:
        """Nodes acted on that were not expected to be."""
        return len(set(self.first_action_s) - set(self.expected))

    @property
    def missed(self) -> tuple[str, ...]:
        """Expected nodes never acted on."""
        return tuple(n for n in self.expected if n not in self.first_action_s)

    @property
    def drain_s(self) -> float | None:
        """The first action of the last expected node acted on (None if one never was)."""
        times = [self.first_action_s.get(n) for n in self.expected]
        if not times or any(t is None for t in times):
            return None
        return max(t for t in times if t is not None)

    @property
    def lead_s(self) -> float | None:
        """Crossing minus drain, for the worst expected node."""
        if self.crossing_s is None or self.drain_s is None:
            return None
        return self.crossing_s - self.drain_s

    @property
    def passed(self) -> bool:
        """Everything applied, no false drain, every expected node acted on, before any crossing."""
        if self.false_drains or self.missed or self.unapplied or self.invalid:
            return False
        return self.lead_s is None or self.lead_s > 0

    def lines(self) -> list[str]:
        """The score as the bench prints it, one row per line."""

        def fmt(v: float | None) -> str:
            return "-" if v is None else f"{v:.0f} s"

        window = (
            self.crossing_s - self.onset_s
            if self.crossing_s is not None and self.onset_s is not None
            else None
        )
        out = [f"scenario {self.name}", f"  judged on {self.judged_on}"]
        if self.invalid:
            out.append(f"  run INVALID: {self.invalid}; lower --speed")
        out.append(f"  fault onset                        {fmt(self.onset_s)}")
        out.append(f"  first GPU at slowdown              {fmt(self.crossing_s)}")
        out.append(f"  warning window                     {fmt(window)}")
        for node, t in sorted(self.first_action_s.items(), key=lambda kv: kv[1]):
            tag = "" if node in self.expected else "  (FALSE DRAIN)"
            out.append(f"  {node} drained at {fmt(t)}{tag}")
        for node in self.missed:
            out.append(f"  {node} expected drained: NEVER")
        for t, node, action in self.unapplied:
            out.append(f"  {node} {action} decided at {fmt(t)}: NEVER REACHED A SCHEDULER")
        out.append(f"  last expected node drained at      {fmt(self.drain_s)}")
        out.append(f"  lead time (crossing - drain)       {fmt(self.lead_s)}  target > 0")
        out.append(f"  false drains                       {self.false_drains}  target 0")
        if self.throttled_gpu_s is not None:
            out.append(f"  throttled GPU-seconds in service   {self.throttled_gpu_s:.0f}  target 0")
        out.append(f"  outcome                            {'PASS' if self.passed else 'FAIL'}")
        return out
