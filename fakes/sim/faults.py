"""Faults a running harness takes on demand: their names, parameters and what each one does.

A fault is either a simulator event applied now (the same validation as a
scenario's ``[[events]]``, so a bad parameter names its key), or a change to
how a fake device answers (the PDU agent, the CDU server, one GPU's sensor).
:func:`parse_fault` checks a request; :class:`FaultError` names what is wrong,
and an unknown fault name lists the known ones.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from fakes.sim.scenario import EventKind


class FaultError(ValueError):
    """A fault request that cannot be applied; the message names the fault and the key."""


class Target(StrEnum):
    """What a fault acts on."""

    SIMULATOR = "simulator"  # a scenario event, applied now
    PDU = "pdu"
    CDU = "cdu"
    GPU = "gpu"
    SCHEDULER = "scheduler"  # the staging scheduler serve runs (--scheduler)


@dataclass(frozen=True, slots=True)
class FaultSpec:
    """One fault: what it does, its parameters with defaults (None: required)."""

    name: str
    target: Target
    description: str
    params: Mapping[str, float | bool | str | None] = field(default_factory=dict)
    event: EventKind | None = None  # for SIMULATOR faults
    # Inclusive (low, high) of each number parameter: what the simulated plant can do.
    bounds: Mapping[str, tuple[float, float]] = field(default_factory=dict)


def _gpu(**extra: float | bool | str | None) -> dict[str, float | bool | str | None]:
    return {"node": None, "gpu": None, **extra}


FAULTS: dict[str, FaultSpec] = {
    f.name: f
    for f in (
        FaultSpec(
            "pump_fail",
            Target.SIMULATOR,
            "the CDU pump stops; loop flow decays to residual_flow_pct",
            {"residual_flow_pct": 3.0},
            EventKind.PUMP_FAIL,
            {"residual_flow_pct": (0.0, 100.0)},
        ),
        FaultSpec(
            "pump_restore", Target.SIMULATOR, "the pump runs again", {}, EventKind.PUMP_RESTORE
        ),
        FaultSpec(
            "chiller_fail",
            Target.SIMULATOR,
            "the facility water warms; coolant supply rises at rate_c_per_min up to max_rise_c",
            {"rate_c_per_min": 1.0, "max_rise_c": 30.0},
            EventKind.CHILLER_FAIL,
            {"rate_c_per_min": (0.001, 60.0), "max_rise_c": (0.0, 80.0)},
        ),
        FaultSpec(
            "chiller_restore",
            Target.SIMULATOR,
            "the chiller recovers",
            {},
            EventKind.CHILLER_RESTORE,
        ),
        FaultSpec(
            "inlet_ramp",
            Target.SIMULATOR,
            "room cooling lost: inlet air rises at rate_c_per_min up to max_rise_c",
            {"rate_c_per_min": 0.5, "max_rise_c": 20.0},
            EventKind.CRAC_FAIL,
            {"rate_c_per_min": (0.001, 60.0), "max_rise_c": (0.0, 80.0)},
        ),
        FaultSpec(
            "inlet_restore", Target.SIMULATOR, "room cooling recovers", {}, EventKind.CRAC_RESTORE
        ),
        FaultSpec(
            "leak", Target.SIMULATOR, "the CDU reports a leak", {"active": True}, EventKind.LEAK
        ),
        FaultSpec(
            "sensor_drop",
            Target.SIMULATOR,
            "one GPU's temperature sensor fails (NVML_ERROR_UNKNOWN) for duration_s",
            {"target": None, "gpu": None, "duration_s": 60.0},
            EventKind.SENSOR_DROPOUT,
            {"duration_s": (0.0, 86400.0)},
        ),
        FaultSpec(
            "sensor_stick",
            Target.GPU,
            "one GPU's temperature sensor sticks at its current value",
            _gpu(),
        ),
        FaultSpec("sensor_unstick", Target.GPU, "a stuck sensor follows the GPU again", _gpu()),
        FaultSpec(
            "gpu_lost", Target.GPU, "one GPU falls off the bus (NVML_ERROR_GPU_IS_LOST)", _gpu()
        ),
        FaultSpec(
            "pdu_slow",
            Target.PDU,
            "the PDU agent answers delay_s late",
            {"delay_s": 2.0},
            bounds={"delay_s": (0.0, 60.0)},
        ),
        FaultSpec("pdu_garbage", Target.PDU, "the PDU agent answers every value with junk bytes"),
        FaultSpec("pdu_silent", Target.PDU, "the PDU agent answers nothing"),
        FaultSpec("pdu_ok", Target.PDU, "the PDU agent answers normally again"),
        FaultSpec(
            "scheduler_down",
            Target.SCHEDULER,
            "the staging scheduler (serve --scheduler) stops listening: deliveries fail",
        ),
        FaultSpec("scheduler_up", Target.SCHEDULER, "the staging scheduler listens again"),
        FaultSpec(
            "cdu_restart",
            Target.CDU,
            "the CDU's OPC-UA server restarts after downtime_s, with new NodeIds if new_node_ids",
            {"new_node_ids": True, "downtime_s": 1.0},
            bounds={"downtime_s": (0.0, 600.0)},
        ),
    )
}


def known() -> str:
    """The known fault names, comma-separated."""
    return ", ".join(FAULTS)


def parse_fault(name: str, given: Mapping[str, Any]) -> tuple[FaultSpec, dict[str, Any]]:
    """The fault called ``name`` and its parameters, defaults filled in and types checked."""
    spec = FAULTS.get(name)
    if spec is None:
        raise FaultError(f"unknown fault {name!r} (known: {known()})")
    params: dict[str, Any] = {}
    for key, default in spec.params.items():
        value = given.get(key, default)
        if value is None:
            raise FaultError(f"{name}: {key}: required parameter is missing")
        if isinstance(default, bool):
            if not isinstance(value, bool):
                raise FaultError(f"{name}: {key}: must be true or false, got {value!r}")
        elif isinstance(default, float):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise FaultError(f"{name}: {key}: must be a number, got {value!r}")
            value = float(value)
            low, high = spec.bounds.get(key, (-math.inf, math.inf))
            if not (math.isfinite(value) and low <= value <= high):
                raise FaultError(f"{name}: {key}: must be from {low:g} to {high:g}, got {value!r}")
        elif key == "gpu":
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 64:
                raise FaultError(f"{name}: {key}: must be a GPU index (0, 1, ...), got {value!r}")
        elif not isinstance(value, str) or len(value) > 253:
            raise FaultError(f"{name}: {key}: must be a name (a string), got {value!r:.80}")
        params[key] = value
    for key in given:
        if key not in spec.params:
            takes = ", ".join(spec.params) or "no parameters"
            raise FaultError(f"{name}: {key}: unknown parameter (takes: {takes})")
    return spec, params


def coerce(text: str) -> bool | int | float | str:
    """A ``key=value`` value from the command line as TOML would read it."""
    if text in ("true", "false"):
        return text == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text
