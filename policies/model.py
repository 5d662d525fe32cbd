"""The data model shared by every layer: readings in, assessments and decisions out."""

from __future__ import annotations

import enum
import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated

import msgspec


class Quality(enum.Enum):
    """How far a reading can be trusted (OPC-UA's Good / Uncertain / Bad)."""

    GOOD = "good"
    UNCERTAIN = "uncertain"
    BAD = "bad"
    ABSENT = "absent"  # not fitted / not on the device: neither a fault nor evidence


_GOOD = Quality.GOOD
_isfinite = math.isfinite


class SensorKind(enum.StrEnum):
    """What a series measures; policies select series by kind, not by name."""

    GPU_TEMPERATURE = "gpu_temperature"
    GPU_MEMORY_TEMPERATURE = "gpu_memory_temperature"
    GPU_SLOWDOWN_THRESHOLD = "gpu_slowdown_threshold"
    GPU_SHUTDOWN_THRESHOLD = "gpu_shutdown_threshold"
    GPU_MAX_OPERATING_THRESHOLD = "gpu_max_operating_threshold"
    GPU_POWER = "gpu_power"
    GPU_POWER_LIMIT = "gpu_power_limit"
    GPU_CLOCK_EVENT_REASONS = "gpu_clock_event_reasons"
    GPU_THERMAL_VIOLATION = "gpu_thermal_violation"  # NVML's cumulative thermal-throttle time
    INLET_TEMPERATURE = "inlet_temperature"  # rack inlet air; label "probe" names the height
    AIR_TEMPERATURE = "air_temperature"  # other air temperatures (cooling unit in/out, ...)
    TEMPERATURE = "temperature"  # a device temperature of no more specific kind
    HUMIDITY = "humidity"
    AIRFLOW = "airflow"
    POWER = "power"
    CURRENT = "current"
    VOLTAGE = "voltage"
    ENERGY = "energy"
    COOLANT_SUPPLY_TEMPERATURE = "coolant_supply_temperature"
    COOLANT_RETURN_TEMPERATURE = "coolant_return_temperature"
    COOLANT_SUPPLY_LIMIT = "coolant_supply_limit"  # the cooling unit's own supply alarm limit
    COOLANT_FLOW = "coolant_flow"
    COOLANT_PRESSURE = "coolant_pressure"
    COOLANT_DIFFERENTIAL_PRESSURE = "coolant_differential_pressure"
    PRESSURE = "pressure"  # a pressure of no more specific kind (e.g. an air filter)
    PUMP_SPEED = "pump_speed"
    PUMP_STATE = "pump_state"
    LEAK = "leak"
    ALARM = "alarm"


class Reading(msgspec.Struct, frozen=True, gc=False):
    """One sample of one series, with its quality; a BAD or ABSENT reading carries no value.

    A msgspec Struct rather than a dataclass like the other models: a replay decodes
    millions of readings, and msgspec builds a Struct several times faster. Not tracked
    by the cyclic garbage collector (``gc=False``): a reading holds strings, numbers and
    its labels (strings), so it can be in no reference cycle, and a replay then neither
    registers nor scans each of its millions of readings.
    """

    source: str
    sensor: str
    kind: SensorKind
    value: float | None
    unit: str
    quality: Quality
    mono: float
    wall: float
    reason: str = ""
    # The device's own time for the value (OPC-UA SourceTimestamp, NVML field timestamp).
    device_ts: float | None = None
    labels: Mapping[str, str] = msgspec.field(default_factory=dict)
    # When a server in between saw the value (OPC-UA ServerTimestamp).
    server_ts: float | None = None

    def __post_init__(self) -> None:
        value = self.value
        if self.quality is _GOOD and value is not None and _isfinite(value):
            return  # the common case, passing every check below (run for each trace line)
        no_value = self.quality is Quality.BAD or self.quality is Quality.ABSENT
        if no_value and self.value is not None:
            raise ValueError(
                f"{self.sensor}: a {self.quality.value} reading must not carry a value"
            )
        if not no_value and self.value is None:
            raise ValueError(f"{self.sensor}: a {self.quality.value} reading needs a value")
        if self.value is not None and not math.isfinite(self.value):
            # NaN compares false with everything: a NaN margin would pass every check.
            raise ValueError(
                f"{self.sensor}: non-finite value {self.value!r} in a {self.quality.value} reading"
            )
        if self.quality is not Quality.GOOD and not self.reason:
            raise ValueError(f"{self.sensor}: a {self.quality.value} reading needs a reason")

    @property
    def key(self) -> str:
        """The series identity: unique across sources."""
        return f"{self.source}/{self.sensor}"

    @property
    def usable(self) -> bool:
        """True when a policy may act on the value (GOOD, and a finite number)."""
        value = self.value
        return self.quality is _GOOD and value is not None and _isfinite(value)


class Action(enum.StrEnum):
    """What rackguard asks the scheduler to do with a node."""

    DRAIN = "drain"  # finish running work, accept no new work
    EXCLUDE = "exclude"  # take it out now (Slurm DOWN, Kubernetes NoExecute)
    RESUME = "resume"  # return to service


class FaultDomain(enum.StrEnum):
    """Where the evidence points."""

    GPU = "gpu"
    NODE = "node"
    RACK = "rack"
    COOLING_LOOP = "cooling_loop"
    NONE = "none"


class Condition(enum.StrEnum):
    """A node's thermal condition as a policy sees it."""

    OK = "ok"
    WARNING = "warning"  # drained, or about to be
    CRITICAL = "critical"  # excluded
    UNKNOWN = "unknown"  # data missing, stale or BAD: never "all clear"


class Assessment(msgspec.Struct, frozen=True):
    """A policy's view of one subject (a GPU, a node, a rack) at one instant."""

    # A Struct, as Reading is: a replay builds one per GPU per evaluation.

    subject: str
    domain: FaultDomain
    condition: Condition
    at: float
    value: float | None = None
    unit: str = ""
    threshold: float | None = None
    trend_per_min: float | None = None
    time_to_threshold_s: float | None = None
    detail: str = ""


def idempotency_key(node: str, action: Action, epoch: int) -> str:
    """A stable key for one intended transition of one node."""
    digest = hashlib.sha256(f"{node}|{action.value}|{epoch}".encode()).hexdigest()
    return f"rg-{digest[:24]}"


REASON_PREFIX = "rackguard:"
# The JSON Schema of a reason (policies.codec derives the schemas from these types).
Reason = Annotated[str, msgspec.Meta(pattern=f"^{REASON_PREFIX}")]


@dataclass(frozen=True, slots=True)
class Decision:
    """A request to change a node's scheduling state, with why and on what evidence."""

    node: str
    action: Action
    reason: Reason
    domain: FaultDomain
    at: float
    key: str
    evidence: tuple[Assessment, ...] = ()
    dry_run: bool = False

    def __post_init__(self) -> None:
        if not self.reason.startswith(REASON_PREFIX):
            raise ValueError(f"decision reason must start with {REASON_PREFIX!r}: {self.reason!r}")
