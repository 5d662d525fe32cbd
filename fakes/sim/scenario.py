"""Scenario files for the rack simulator: a TOML data model, its loader and the shipped set.

A scenario names one rack (nodes, GPUs per node, GPU model, inlet probe heights),
the facility around it (coolant supply setpoint, loop flow, room temperature), a
timeline of events, and an ``[expect]`` table: the ground truth that tests and
benchmarks score a run against. Every problem raises :class:`ScenarioError` whose
message starts with the file and the key path, e.g. ``hot-gpu.toml: events[1].factor``.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from types import MappingProxyType
from typing import Any

from fakes.gpus import MODELS, GpuModel

SCENARIO_DIR = Path(__file__).resolve().parent.parent / "scenarios"

RACK = "rack"
CDU = "cdu"


class ScenarioError(ValueError):
    """A scenario file that cannot be used; the message names the file and the key."""


class EventKind(StrEnum):
    """What an event does to the rack."""

    JOB_START = "job_start"
    JOB_STOP = "job_stop"
    POWER_CAP = "power_cap"
    COLD_PLATE_DEGRADE = "cold_plate_degrade"
    COLD_PLATE_REPAIR = "cold_plate_repair"
    SENSOR_DROPOUT = "sensor_dropout"
    PUMP_FAIL = "pump_fail"
    PUMP_RESTORE = "pump_restore"
    CHILLER_FAIL = "chiller_fail"
    CHILLER_RESTORE = "chiller_restore"
    CRAC_FAIL = "crac_fail"
    CRAC_RESTORE = "crac_restore"
    LEAK = "leak"
    CDU_SILENT = "cdu_silent"  # the cooling unit stops answering its clients for a while


class _Target(StrEnum):
    NODES = "a node name or 'rack'"  # gpu optional
    GPU = "a node name (with gpu)"  # gpu required
    CDU = "'cdu'"
    RACK = "'rack'"


@dataclass(frozen=True, slots=True)
class _Param:
    kind: type[float] | type[bool]
    default: float | bool | None  # None: required
    lo: float | None = None
    hi: float | None = None


# kind -> (target, parameters). Numbers are floats; bools stay bools.
_EVENT_SPECS: dict[EventKind, tuple[_Target, dict[str, _Param]]] = {
    EventKind.JOB_START: (_Target.NODES, {"util": _Param(float, 0.9, 0.0, 1.0)}),
    EventKind.JOB_STOP: (_Target.NODES, {}),
    EventKind.POWER_CAP: (_Target.NODES, {"limit_w": _Param(float, None, 1.0, None)}),
    EventKind.COLD_PLATE_DEGRADE: (
        _Target.GPU,
        {"factor": _Param(float, None, 1.0, 100.0), "ramp_s": _Param(float, 0.0, 0.0, None)},
    ),
    EventKind.COLD_PLATE_REPAIR: (_Target.GPU, {"ramp_s": _Param(float, 0.0, 0.0, None)}),
    EventKind.SENSOR_DROPOUT: (_Target.GPU, {"duration_s": _Param(float, None, 0.0, None)}),
    EventKind.PUMP_FAIL: (_Target.CDU, {"residual_flow_pct": _Param(float, 3.0, 0.0, 100.0)}),
    EventKind.PUMP_RESTORE: (_Target.CDU, {}),
    EventKind.CHILLER_FAIL: (
        _Target.CDU,
        {
            "rate_c_per_min": _Param(float, 1.0, 0.0, 60.0),
            "max_rise_c": _Param(float, 30.0, 0.0, 80.0),
        },
    ),
    EventKind.CHILLER_RESTORE: (_Target.CDU, {}),
    EventKind.CRAC_FAIL: (
        _Target.RACK,
        {
            "rate_c_per_min": _Param(float, 0.5, 0.0, 60.0),
            "max_rise_c": _Param(float, 20.0, 0.0, 80.0),
        },
    ),
    EventKind.CRAC_RESTORE: (_Target.RACK, {}),
    EventKind.LEAK: (_Target.CDU, {"active": _Param(bool, True)}),
    EventKind.CDU_SILENT: (_Target.CDU, {"duration_s": _Param(float, None, 0.0, None)}),
}


@dataclass(frozen=True, slots=True)
class Event:
    """One timeline entry; `params` holds every parameter of its kind, defaults filled in."""

    at_s: float
    kind: EventKind
    target: str  # a node name, "rack" or "cdu"
    gpu: int | None = None
    params: Mapping[str, float | bool] = field(default_factory=lambda: MappingProxyType({}))

    def num(self, name: str) -> float:
        """A numeric parameter."""
        return float(self.params[name])


@dataclass(frozen=True, slots=True)
class RackLayout:
    """The rack: node names bottom to top, GPUs per node, inlet probe labels bottom to top.

    ``empty_probe_slots`` are PDU sensor slots with no probe fitted: the PDU reports a
    sentinel for them, which a reader turns into ABSENT readings.
    """

    nodes: tuple[str, ...]
    gpus_per_node: int = 8
    gpu_model: str = "h100-sxm"
    probes: tuple[str, ...] = ("bottom", "middle", "top")
    host_overhead_w: float = 2000.0
    empty_probe_slots: tuple[str, ...] = ()

    @property
    def model(self) -> GpuModel:
        """The GPU model preset named by `gpu_model`."""
        return MODELS[self.gpu_model]


@dataclass(frozen=True, slots=True)
class Facility:
    """Cooling and room around the rack at the start of a run."""

    supply_setpoint_c: float = 30.0
    flow_lpm: float = 40.0
    room_c: float = 22.0
    inlet_gradient_c: float = 2.5  # top probe minus bottom probe


@dataclass(frozen=True, slots=True)
class Noise:
    """Standard deviation of the sensor noise (outputs only, never the state)."""

    temperature_c: float = 0.25
    power_w: float = 2.0


@dataclass(frozen=True, slots=True)
class Crossing:
    """Where and when (absolute simulated seconds) the first slowdown crossing must happen."""

    window_s: tuple[float, float]
    node: str | None = None  # None: any node
    gpu: int | None = None  # None: any GPU


@dataclass(frozen=True, slots=True)
class Expect:
    """Ground truth for a run of the whole scenario."""

    drained_nodes: tuple[str, ...] = ()
    # Of those, the nodes that must be back in service at the end of the run.
    resumed_nodes: tuple[str, ...] = ()
    first_crossing: Crossing | None = None  # None: no GPU may cross slowdown
    min_margin_c: float | None = None  # every GPU stays this far below slowdown
    final_max_c: float | None = None  # every live GPU ends the run at or below this

    @property
    def drains(self) -> int:
        """How many nodes a correct agent drains."""
        return len(self.drained_nodes)


@dataclass(frozen=True, slots=True)
class Scenario:
    """A loaded scenario file."""

    name: str
    description: str
    duration_s: float
    seed: int
    rack: RackLayout
    facility: Facility
    noise: Noise
    events: tuple[Event, ...]
    expect: Expect
    source: str = ""


class _Table:
    """A TOML table being consumed key by key; leftovers are unknown keys."""

    def __init__(self, data: Mapping[str, Any], path: str, where: str) -> None:
        self._data = dict(data)
        self._path = path
        self._where = where

    def key(self, name: str) -> str:
        return f"{self._path}.{name}" if self._path else name

    def fail(self, key: str, message: str) -> ScenarioError:
        return ScenarioError(f"{self._where}: {key}: {message}")

    def _take(self, name: str, required: bool) -> Any:
        if name in self._data:
            return self._data.pop(name)
        if required:
            raise self.fail(self.key(name), "required key is missing")
        return None

    def str_(self, name: str, default: str | None = None) -> str:
        value = self._take(name, default is None)
        if value is None:
            assert default is not None
            return default
        if not isinstance(value, str):
            raise self.fail(self.key(name), f"must be a string, got {_describe(value)}")
        return value

    def num(self, name: str, default: float | None = None, *, lo: float | None = None) -> float:
        value = self._take(name, default is None)
        if value is None:
            assert default is not None
            return default
        return _number(self, self.key(name), value, lo, None)

    def int_(self, name: str, default: int | None = None, *, lo: int | None = None) -> int:
        value = self._take(name, default is None)
        if value is None:
            assert default is not None
            return default
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.fail(self.key(name), f"must be an integer, got {_describe(value)}")
        if lo is not None and value < lo:
            raise self.fail(self.key(name), f"must be at least {lo}, got {value}")
        return value

    def strs(self, name: str, default: tuple[str, ...] | None = None) -> tuple[str, ...]:
        value = self._take(name, default is None)
        if value is None:
            assert default is not None
            return default
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.fail(self.key(name), f"must be an array of strings, got {_describe(value)}")
        return tuple(value)

    def table(self, name: str, *, required: bool = False) -> _Table:
        value = self._take(name, required)
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise self.fail(self.key(name), f"must be a table, got {_describe(value)}")
        return _Table(value, self.key(name), self._where)

    def has(self, name: str) -> bool:
        return name in self._data

    def raw(self, name: str) -> Any:
        return self._take(name, False)

    def done(self) -> None:
        for name in self._data:
            raise self.fail(self.key(name), "unknown key")


def _describe(value: Any) -> str:
    if isinstance(value, bool):
        return f"boolean {value!r}"
    if isinstance(value, dict):
        return "table"
    if isinstance(value, list):
        return "array"
    kind = {int: "integer", float: "number", str: "string"}.get(type(value), type(value).__name__)
    return f"{kind} {value!r}"


def _number(t: _Table, key: str, value: Any, lo: float | None, hi: float | None) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise t.fail(key, f"must be a number, got {_describe(value)}")
    if lo is not None and value < lo:
        raise t.fail(key, f"must be at least {lo:g}, got {value}")
    if hi is not None and value > hi:
        raise t.fail(key, f"must be at most {hi:g}, got {value}")
    return float(value)


def _event(t: _Table, rack: RackLayout, duration_s: float) -> Event:
    at_s = t.num("at_s", lo=0.0)
    if at_s > duration_s:
        raise t.fail(t.key("at_s"), f"is after the end of the run ({duration_s:g} s)")
    kind_name = t.str_("kind")
    try:
        kind = EventKind(kind_name)
    except ValueError:
        known = ", ".join(k.value for k in EventKind)
        raise t.fail(t.key("kind"), f"unknown event kind {kind_name!r} (known: {known})") from None
    target_kind, specs = _EVENT_SPECS[kind]
    default_target = {_Target.CDU: CDU, _Target.RACK: RACK}.get(target_kind)
    target = t.str_("target", default_target)
    gpu = t.int_("gpu", -1, lo=0)
    has_gpu = gpu >= 0
    if target_kind in (_Target.CDU, _Target.RACK):
        if target != default_target:
            raise t.fail(t.key("target"), f"must be {target_kind.value} for {kind}, got {target!r}")
        if has_gpu:
            raise t.fail(t.key("gpu"), f"unknown key for {kind}")
    else:
        allowed = rack.nodes if target_kind is _Target.GPU else (*rack.nodes, RACK)
        if target not in allowed:
            raise t.fail(t.key("target"), f"must be {target_kind.value}, got {target!r}")
        if target_kind is _Target.GPU and not has_gpu:
            raise t.fail(t.key("gpu"), f"required key is missing for {kind}")
        if has_gpu and target == RACK:
            raise t.fail(t.key("gpu"), "needs a node target, not 'rack'")
        if has_gpu and gpu >= rack.gpus_per_node:
            raise t.fail(t.key("gpu"), f"must be below gpus_per_node ({rack.gpus_per_node})")
    params: dict[str, float | bool] = {}
    for name, spec in specs.items():
        key = t.key(name)
        value = t.raw(name)
        if value is None:
            if spec.default is None:
                raise t.fail(key, f"required key is missing for {kind}")
            params[name] = spec.default
        elif spec.kind is bool:
            if not isinstance(value, bool):
                raise t.fail(key, f"must be true or false, got {_describe(value)}")
            params[name] = value
        else:
            params[name] = _number(t, key, value, spec.lo, spec.hi)
    t.done()
    return Event(at_s, kind, target, gpu if has_gpu else None, MappingProxyType(params))


def parse_event(
    data: Mapping[str, Any], rack: RackLayout, *, where: str = "<event>", key: str = "event"
) -> Event:
    """Validate one event table (as in a scenario's ``[[events]]``) against a rack layout."""
    return _event(_Table(data, key, where), rack, math.inf)


def _expect(t: _Table, rack: RackLayout) -> Expect:
    drained = t.strs("drained_nodes", ())
    for node in drained:
        if node not in rack.nodes:
            raise t.fail(t.key("drained_nodes"), f"names unknown node {node!r}")
    resumed = t.strs("resumed_nodes", ())
    for node in resumed:
        if node not in drained:
            raise t.fail(
                t.key("resumed_nodes"), f"names {node!r}, which drained_nodes does not list"
            )
    if t.has("drains"):
        drains = t.int_("drains", lo=0)
        if drains != len(drained):
            raise t.fail(
                t.key("drains"), f"is {drains} but drained_nodes lists {len(drained)} node(s)"
            )
    crossing: Crossing | None = None
    if t.has("first_crossing"):
        c = t.table("first_crossing")
        where_node = c.str_("node", "") or None
        if where_node is not None and where_node not in rack.nodes:
            raise c.fail(c.key("node"), f"names unknown node {where_node!r}")
        gpu = c.int_("gpu", -1, lo=0)
        raw = c.raw("window_s")
        if raw is None:
            raise c.fail(c.key("window_s"), "required key is missing")
        if not isinstance(raw, list) or len(raw) != 2:
            raise c.fail(c.key("window_s"), f"must be [earliest, latest], got {_describe(raw)}")
        lo = _number(c, c.key("window_s"), raw[0], 0.0, None)
        hi = _number(c, c.key("window_s"), raw[1], lo, None)
        c.done()
        crossing = Crossing((lo, hi), where_node, gpu if gpu >= 0 else None)
    margin = t.num("min_margin_c", -1.0)
    final = t.num("final_max_c", -1.0)
    t.done()
    return Expect(
        drained, resumed, crossing, margin if margin >= 0 else None, final if final >= 0 else None
    )


def parse_scenario(data: Mapping[str, Any], *, where: str = "<scenario>") -> Scenario:
    """Build a Scenario from parsed TOML; `where` prefixes every error message."""
    top = _Table(data, "", where)
    name = top.str_("name")
    description = top.str_("description")
    duration_s = top.num("duration_s", lo=1.0)
    seed = top.int_("seed", 0)

    r = top.table("rack", required=True)
    nodes = r.strs("nodes")
    if not nodes:
        raise r.fail(r.key("nodes"), "must name at least one node")
    if len(set(nodes)) != len(nodes):
        raise r.fail(r.key("nodes"), "has duplicate names")
    if RACK in nodes or CDU in nodes:
        raise r.fail(r.key("nodes"), "may not use the reserved names 'rack' or 'cdu'")
    gpus_per_node = r.int_("gpus_per_node", 8, lo=1)
    gpu_model = r.str_("gpu_model", "h100-sxm")
    if gpu_model not in MODELS:
        known = ", ".join(sorted(MODELS))
        raise r.fail(r.key("gpu_model"), f"unknown GPU model {gpu_model!r} (known: {known})")
    probes = r.strs("probes", ("bottom", "middle", "top"))
    if not probes or len(set(probes)) != len(probes):
        raise r.fail(r.key("probes"), "must list at least one label, without duplicates")
    empty = r.strs("empty_probe_slots", ())
    if set(empty) & set(probes) or len(set(empty)) != len(empty):
        raise r.fail(r.key("empty_probe_slots"), "must not repeat a slot or name a fitted probe")
    rack = RackLayout(
        nodes, gpus_per_node, gpu_model, probes, r.num("host_overhead_w", 2000.0, lo=0.0), empty
    )
    r.done()

    f = top.table("facility")
    facility = Facility(
        supply_setpoint_c=f.num("supply_setpoint_c", 30.0, lo=5.0),
        flow_lpm=f.num("flow_lpm", 40.0, lo=1.0),
        room_c=f.num("room_c", 22.0),
        inlet_gradient_c=f.num("inlet_gradient_c", 2.5, lo=0.0),
    )
    f.done()

    n = top.table("noise")
    noise = Noise(n.num("temperature_c", 0.25, lo=0.0), n.num("power_w", 2.0, lo=0.0))
    n.done()

    raw_events = top.raw("events")
    if raw_events is None:
        raw_events = []
    if not isinstance(raw_events, list):
        raise top.fail("events", f"must be an array of tables, got {_describe(raw_events)}")
    events: list[Event] = []
    for i, item in enumerate(raw_events):
        if not isinstance(item, dict):
            raise top.fail(f"events[{i}]", f"must be a table, got {_describe(item)}")
        events.append(_event(_Table(item, f"events[{i}]", where), rack, duration_s))
    events.sort(key=lambda e: e.at_s)  # stable: same-time events keep file order

    expect = _expect(top.table("expect", required=True), rack)
    top.done()
    return Scenario(
        name, description, duration_s, seed, rack, facility, noise, tuple(events), expect, where
    )


def list_scenarios() -> list[str]:
    """Names of the shipped scenarios, sorted."""
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.toml"))


def load_scenario(name_or_path: str) -> Scenario:
    """Load a shipped scenario by bare name (e.g. "hot-gpu") or any TOML file by path."""
    is_path = "/" in name_or_path or name_or_path.endswith(".toml")
    path = Path(name_or_path) if is_path else SCENARIO_DIR / f"{name_or_path}.toml"
    if not path.is_file():
        known = ", ".join(list_scenarios())
        raise ScenarioError(f"{name_or_path}: no such scenario (shipped: {known})")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as err:
        raise ScenarioError(f"{path.name}: not valid TOML: {err}") from err
    return parse_scenario(data, where=path.name)
