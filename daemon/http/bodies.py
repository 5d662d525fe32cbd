"""The API's bodies (responses, events): one frozen dataclass each, the one definition of its shape.

Their JSON (:func:`to_wire`, encoded by orjson as the API always was) and their
OpenAPI component schemas (:func:`body_schemas`) are derived from these classes
by msgspec, as :mod:`policies.codec` derives the model's. A field defaulting to
``UNSET`` is left out of the body when unset, and is the only kind of field a
schema does not require.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec
import orjson
from msgspec import UNSET, Meta, UnsetType

from daemon.clock import UNIX_TIME, UnixTime
from daemon.cluster.status import ClusterStatus
from daemon.delivery.outbox import Status
from daemon.delivery.overrides import AuditEntry
from daemon.poller import Health as SourceHealthState
from daemon.service.power_cap import CapRecord, GpuCap
from policies.codec import assessment_wire, decision_wire, schema_components, to_data
from policies.model import Action, Assessment, Condition, Decision, Quality, SensorKind
from policies.safety import Pin

# Bodies that hold a stored decision as it was written (its evidence keeps its
# ``at``): shown as it is, described as a Decision.
StoredDecision = Annotated[
    dict[str, Any], Meta(extra_json_schema={"$ref": "#/components/schemas/Decision"})
]


@dataclass(frozen=True, slots=True)
class ErrorDetail:
    """What went wrong: a stable code and a message for people."""

    code: str
    message: str


@dataclass(frozen=True, slots=True)
class Error:
    """Every error body."""

    error: ErrorDetail


@dataclass(frozen=True, slots=True)
class Health:
    """GET /healthz: the process is alive."""

    status: Literal["ok"] = "ok"


@dataclass(frozen=True, slots=True)
class OutboxHealth:
    """Whether the decision store takes writes, and why not."""

    writable: bool
    error: str


@dataclass(frozen=True, slots=True)
class Ready:
    """GET /readyz: every source reported once and the outbox is writable."""

    ready: bool
    sources: dict[str, bool]
    outbox: OutboxHealth
    # Why not ready: the disk refusing or stalling, a refusal by the scheduler.
    problems: list[str]
    simulated: bool
    # Degraded coordination does not make the agent unready: it still protects its node.
    cluster: ClusterStatus | UnsetType = UNSET
    # Sources that fail, or answer without evidence (a PDU its profile reads nothing
    # from): source -> why; absent when none. They do not make the agent unready.
    degraded: dict[str, str] | UnsetType = UNSET


@dataclass(frozen=True, slots=True)
class SourceHealth:
    """One source's health and counters."""

    health: Annotated[str, Meta(extra_json_schema={"enum": [h.value for h in SourceHealthState]})]
    last_error: str
    attempts: int
    failures: int
    skipped_ticks: int


@dataclass(frozen=True, slots=True)
class Series:
    """One series' latest value, unit, quality and age."""

    key: str
    source: str
    sensor: str
    kind: SensorKind
    value: float | None
    unit: str
    quality: Quality
    reason: str
    stale: Annotated[
        bool, Meta(description="older than the policy's stale limit: shown bad, without value")
    ]
    age_s: Annotated[float, Meta(description="seconds since the reading was taken")]
    device_ts: UnixTime | None  # the device's own stamp, where it gives one
    server_ts: UnixTime | None  # an OPC-UA server's stamp
    labels: dict[str, str]


@dataclass(frozen=True, slots=True)
class State:
    """GET /v1/state: every series and each source's health."""

    as_of: Annotated[float, Meta(description=f"when the ages were computed; {UNIX_TIME}")]
    node: str
    rack: str
    simulated: Annotated[
        bool, Meta(description="true when the GPUs are a simulation (demo, tests), never a node")
    ]
    condition: Condition
    assessment: Assessment | None
    sources: dict[str, SourceHealth]
    series: list[Series]
    scheduler: SchedulerState | UnsetType = UNSET  # absent before the service wired it
    # Per GPU: the enforced limit, a cap below the default and who set it (rackguard or
    # another actor); absent while [power_cap] is off.
    power_caps: list[GpuCap] | UnsetType = UNSET


@dataclass(frozen=True, slots=True)
class Assessments:
    """GET /v1/assessments: the policy's latest view per GPU, node and rack."""

    at: UnixTime | None  # when the policy evaluated; null before its first evaluation
    node: Assessment | None
    gpus: list[Assessment]
    rack: Assessment | None
    note: str | UnsetType = UNSET  # absent before the first evaluation


ConfirmedBy = Annotated[
    Literal["read_back", "answer", ""],
    Meta(
        description="read_back: the scheduler showed the intended state when read back;"
        " answer: a sink that cannot read back (the webhook) accepted it; '': not confirmed"
    ),
]


@dataclass(frozen=True, slots=True)
class Delivery:
    """Where a logged decision's delivery stands."""

    status: Status
    attempts: int
    last_error: str
    outcome: str
    origin: str
    done_at: UnixTime | None
    confirmed_by: ConfirmedBy = ""


@dataclass(frozen=True, slots=True)
class LogItem:
    """One entry of the decision log: a decision (and its delivery), a power cap change
    (cap, restore, or release of a limit another actor changed) or an audited override."""

    kind: Literal["decision", "override", "cap"]
    id: int
    at: UnixTime
    node: str
    action: str
    decision: StoredDecision | UnsetType = UNSET  # a decision's
    delivery: Delivery | UnsetType = UNSET  # a decision's
    actor: str | UnsetType = UNSET  # an override's
    override: dict[str, Any] | UnsetType = UNSET  # an override's audit record, as written
    cap: CapRecord | UnsetType = UNSET  # a power cap change's: GPU, watts, who set it, why


@dataclass(frozen=True, slots=True)
class DecisionLog:
    """GET /v1/decisions: one page, newest first."""

    items: list[LogItem]
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class OutboxItem:
    """A decision waiting for the scheduler."""

    seq: int
    decision: Decision
    attempts: int
    last_error: str
    queued_at: UnixTime
    origin: str
    durable: bool


@dataclass(frozen=True, slots=True)
class Outbox:
    """GET /v1/outbox: decisions not yet confirmed, oldest first."""

    pending: int
    items: list[OutboxItem]
    # The scheduler's refusal an operator must fix (auth, not found), or null.
    refusal: str | None


@dataclass(frozen=True, slots=True)
class PinEntry:
    """A node pinned by an operator."""

    node: str
    pin: Pin
    reason: str


@dataclass(frozen=True, slots=True)
class Overrides:
    """GET /v1/overrides: the overrides in force."""

    pins: list[PinEntry]
    predictive_paused: bool
    paused_reason: str


@dataclass(frozen=True, slots=True)
class OverrideResult:
    """POST /v1/overrides: what was applied, and the overrides now in force."""

    applied: AuditEntry
    overrides: Overrides


@dataclass(frozen=True, slots=True)
class DeliveryEvent:
    """The ``delivery`` event: where a decision's delivery now stands (after each attempt)."""

    node: str
    action: Action
    key: str
    status: Status
    outcome: str
    id: int = 0  # the decision's id in /v1/decisions
    attempts: int = 0
    last_error: str = ""
    confirmed_by: ConfirmedBy = ""
    done_at: UnixTime | None = None


@dataclass(frozen=True, slots=True)
class SchedulerState:
    """What rackguard asked of the scheduler for this node, and what it last read back."""

    intent: Action | None  # the newest decision's action (null: none yet)
    delivery: Status | None  # where that decision's delivery stands
    attempts: int
    last_error: str
    read_back: str | None  # the scheduler's state as last read back (null: never read)
    read_back_at: UnixTime | None


# The bodies' wire forms where they differ from the plain data (policies/codec.py).
_WIRE_FORMS: Mapping[type, Callable[[Any], Any]] = {
    Assessment: assessment_wire,
    Decision: decision_wire,
}


@functools.cache
def _holds_wire_form(cls: type) -> bool:
    """Whether a body class holds, anywhere inside, a model with its own wire form."""
    todo: list[Any] = list(typing.get_type_hints(cls).values())
    while todo:
        t = todo.pop()
        todo.extend(typing.get_args(t))
        if t in _WIRE_FORMS:
            return True
        if isinstance(t, type) and dataclasses.is_dataclass(t) and _holds_wire_form(t):
            return True
    return False


def _plain(cls: type) -> bool:
    """Whether msgspec alone encodes a value of ``cls`` as the wire has it."""
    if dataclasses.is_dataclass(cls):
        return cls not in _WIRE_FORMS and not _holds_wire_form(cls)
    return cls in (str, int, float, bool, type(None))


def to_wire(obj: Any) -> Any:
    """A body as the JSON-able data the API sends: UNSET fields left out, models in wire form."""
    form = _WIRE_FORMS.get(type(obj))
    if form is not None:
        return form(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        if not _holds_wire_form(type(obj)):
            return to_data(obj)  # the fast path: msgspec does it all
        data = {}
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if value is not UNSET:
                data[f.name] = to_wire(value)
        return data
    if isinstance(obj, list | tuple):
        if all(_plain(type(x)) for x in obj):
            return to_data(obj)  # /v1/state's series: one call
        return [to_wire(x) for x in obj]
    if isinstance(obj, Mapping):
        return {k: to_wire(v) for k, v in obj.items()}
    if isinstance(obj, enum.Enum):
        return obj.value
    return obj


def encode(body: Any) -> bytes:
    """A body's JSON bytes (orjson: fast, and the byte form clients have always had)."""
    return orjson.dumps(to_wire(body))


def body_schemas(types: Iterable[type]) -> dict[str, Any]:
    """The OpenAPI component schemas of ``types`` and of what they hold (Decision included)."""
    return schema_components((Decision, *types))


def request_schemas(types: Iterable[type]) -> dict[str, Any]:
    """The component schemas of request bodies: a field is required where it has no default."""
    _, components = msgspec.json.schema_components(tuple(types), ref_template=_REF)
    return dict(components)


_REF = "#/components/schemas/{name}"
