"""Two nodes of one rack, fed hand-made readings second by second, for the policy's tests.

CDU series every 5 s (as the simulator and a polled CDU report them), GPUs every second.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from policies import rack
from policies.attribution import LoopEvidence
from policies.model import Action, FaultDomain, Quality, Reading, SensorKind
from policies.policy import Outcome, Policy
from policies.safety import ClusterLedger, Overrides
from policies.settings import PolicySettings

RACKS = {"r1": ("n1", "n2")}
S = PolicySettings(min_dwell_s=0.0, resume_after_s=30.0, resume_jitter=0.0)
COOL = (60.0, 60.0, 60.0, 60.0)
ONE_HOT = (60.0, 86.0, 60.0, 60.0)  # 4 C under slowdown: at the enter margin


def reading(
    sensor: str,
    kind: SensorKind,
    value: float | None,
    t: float,
    labels: Mapping[str, str],
    source: str = "cdu",
) -> Reading:
    quality = Quality.GOOD if value is not None else Quality.BAD
    reason = "" if value is not None else "BadSensorFailure"
    return Reading(source, sensor, kind, value, "x", quality, t, t, reason, labels=labels)


def gpus(node: str, t: float, temps: Iterable[float]) -> list[Reading]:
    out = []
    for i, temp in enumerate(temps):
        labels = MappingProxyType({"node": node, "gpu": str(i)})
        for name, kind, value in (
            ("slowdown_threshold", SensorKind.GPU_SLOWDOWN_THRESHOLD, 90.0),
            ("shutdown_threshold", SensorKind.GPU_SHUTDOWN_THRESHOLD, 95.0),
            ("power", SensorKind.GPU_POWER, 600.0),
            ("power_limit", SensorKind.GPU_POWER_LIMIT, 700.0),
            ("temperature", SensorKind.GPU_TEMPERATURE, temp),
        ):
            out.append(reading(f"gpu{i}.{name}", kind, value, t, labels, "gpus"))
    return out


RACK = MappingProxyType({"rack": "r1"})
HEALTHY_CDU: dict[str, float | None] = {
    "supply": 30.0,
    "return": 37.0,
    "flow": 100.0,
    "pump": 1.0,
    "leak": 0.0,
}
CDU_KINDS = {
    "supply": SensorKind.COOLANT_SUPPLY_TEMPERATURE,
    "return": SensorKind.COOLANT_RETURN_TEMPERATURE,
    "flow": SensorKind.COOLANT_FLOW,
    "pump": SensorKind.PUMP_STATE,
    "pump2": SensorKind.PUMP_STATE,
    "leak": SensorKind.LEAK,
    "inlet": SensorKind.INLET_TEMPERATURE,
    "supply_limit": SensorKind.COOLANT_SUPPLY_LIMIT,
}


def cdu(t: float, values: Mapping[str, float | None]) -> list[Reading]:
    """One CDU/PDU poll: every named series (None: a BAD reading)."""
    return [reading(name, CDU_KINDS[name], v, t, RACK) for name, v in values.items()]


@dataclass
class Sim:
    """Two nodes of one rack, a ledger for the peers' view, one second per step."""

    settings: PolicySettings = S
    t: float = 0.0
    policy: Policy = field(init=False)
    ledger: ClusterLedger = field(init=False)

    def __post_init__(self) -> None:
        self.policy = Policy(self.settings, RACKS)
        self.ledger = ClusterLedger(RACKS, 600.0)

    def step(
        self, temps: Mapping[str, Iterable[float]], rack: Mapping[str, float | None] | None
    ) -> dict[str, Outcome]:
        readings = [r for n, ts in temps.items() for r in gpus(n, self.t, ts)]
        if rack is not None and self.t % 5 == 0:
            readings += cdu(self.t, rack)
        self.policy.observe(readings)
        out = self.policy.evaluate(self.t, 1e9 + self.t, self.ledger.view(self.t), Overrides())
        for o in out.values():
            if o.decision is not None:
                self.ledger.record(o.decision, self.t, critical=o.critical, following=o.following)
        self.t += 1.0
        return out

    def run(
        self,
        seconds: int,
        temps: Mapping[str, Iterable[float]],
        rack: Mapping[str, float | None] | None = None,
    ) -> list[Outcome]:
        decided = []
        for _ in range(seconds):
            decided += [o for o in self.step(temps, rack).values() if o.decision is not None]
        return decided

    def loop(self) -> LoopEvidence:
        return rack.loop_evidence(
            "r1", self.policy.tracker.rack["r1"], self.t - 1.0, self.policy.settings
        )


def actions(decided: list[Outcome]) -> list[tuple[str, Action, FaultDomain]]:
    return [(o.decision.node, o.decision.action, o.decision.domain) for o in decided if o.decision]
