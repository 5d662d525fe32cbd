"""The simulator's scenarios as traces: readings as the agents' sources would report them.

Per node, every ``interval_s``: each GPU's temperature, slowdown and shutdown
thresholds, power and power limit (source "gpus", sensors named as the NVML
adapter names them, labels ``node`` and ``gpu``); a dropped-out temperature
sensor is a BAD reading with NVML_ERROR_UNKNOWN, a lost GPU BAD readings with
NVML_ERROR_GPU_IS_LOST. Per rack, every ``rack_interval_s``: the PDU's inlet
probes (INLET_TEMPERATURE, label ``probe``) and phase power (source "pdu"), the
CDU's supply, return, flow, pump speed and state, differential pressure and
leak (source "cdu"), all labelled ``rack``.

The simulator is stepped directly (no daemon, no sockets), faster than real
time and deterministically: the same scenario and seed give the same trace.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import MappingProxyType
from typing import TextIO

from fakes.sim.scenario import Scenario, load_scenario
from fakes.sim.thermal import RackSimulator, RackSnapshot
from policies.model import Quality, Reading, SensorKind
from policies.trace import Header, encode_header, encode_reading

RACK_NAME = "rack-sim"
WALL_EPOCH = 1_767_225_600.0  # 2026-01-01T00:00:00Z: wall time of t = 0, fixed for determinism
_LOST = "NVML_ERROR_GPU_IS_LOST: GPU is lost"
_DROPPED = "NVML_ERROR_UNKNOWN: unknown error"


def header_for(scenario: Scenario, rack: str = RACK_NAME, seed: int | None = None) -> Header:
    """The trace header of a scenario: one rack holding its nodes."""
    meta = {
        "scenario": scenario.name,
        "seed": scenario.seed if seed is None else seed,
        "duration_s": scenario.duration_s,
        "source": "fakes.sim",
    }
    return Header(MappingProxyType({rack: scenario.rack.nodes}), MappingProxyType(meta))


def gpu_readings(snap: RackSnapshot, scenario: Scenario, wall_epoch: float) -> list[Reading]:
    """Every GPU's readings in one snapshot."""
    model = scenario.rack.model
    t = snap.t
    wall = wall_epoch + t
    out = []
    for node in snap.nodes:
        for g in node.gpus:
            labels = MappingProxyType({"node": node.name, "gpu": str(g.index)})

            def add(
                suffix: str,
                kind: SensorKind,
                unit: str,
                value: float | None,
                reason: str = "",
                labels: MappingProxyType[str, str] = labels,
                index: int = g.index,
            ) -> None:
                quality = Quality.GOOD if value is not None else Quality.BAD
                out.append(
                    Reading(
                        "gpus",
                        f"gpu{index}.{suffix}",
                        kind,
                        value,
                        unit,
                        quality,
                        t,
                        wall,
                        reason=reason,
                        labels=labels,
                    )
                )

            if g.lost:
                for suffix, kind, unit in (
                    ("temperature", SensorKind.GPU_TEMPERATURE, "celsius"),
                    ("slowdown_threshold", SensorKind.GPU_SLOWDOWN_THRESHOLD, "celsius"),
                    ("shutdown_threshold", SensorKind.GPU_SHUTDOWN_THRESHOLD, "celsius"),
                    ("power", SensorKind.GPU_POWER, "watts"),
                    ("power_limit", SensorKind.GPU_POWER_LIMIT, "watts"),
                ):
                    add(suffix, kind, unit, None, _LOST)
                continue
            if g.dropped_out:
                add("temperature", SensorKind.GPU_TEMPERATURE, "celsius", None, _DROPPED)
            else:
                add("temperature", SensorKind.GPU_TEMPERATURE, "celsius", g.temperature_c)
            add(
                "slowdown_threshold", SensorKind.GPU_SLOWDOWN_THRESHOLD, "celsius", model.slowdown_c
            )
            add(
                "shutdown_threshold", SensorKind.GPU_SHUTDOWN_THRESHOLD, "celsius", model.shutdown_c
            )
            add("power", SensorKind.GPU_POWER, "watts", g.power_w)
            add("power_limit", SensorKind.GPU_POWER_LIMIT, "watts", g.power_limit_w)
    return out


_NO_PROBE = "no probe fitted (the PDU reports its sentinel for this slot)"


def rack_readings(
    snap: RackSnapshot, rack: str, wall_epoch: float, empty_slots: tuple[str, ...] = ()
) -> list[Reading]:
    """The PDU's and the CDU's readings in one snapshot (none of the CDU's while it is silent)."""
    t = snap.t
    wall = wall_epoch + t
    out = []

    def add(
        source: str, sensor: str, kind: SensorKind, unit: str, value: float, **extra: str
    ) -> None:
        labels = MappingProxyType({"rack": rack, **extra})
        out.append(Reading(source, sensor, kind, value, unit, Quality.GOOD, t, wall, labels=labels))

    for probe, c in snap.inlet_c.items():
        add("pdu", f"inlet.{probe}", SensorKind.INLET_TEMPERATURE, "celsius", c, probe=probe)
    for slot in empty_slots:
        labels = MappingProxyType({"rack": rack, "probe": slot})
        out.append(
            Reading(
                "pdu",
                f"inlet.{slot}",
                SensorKind.INLET_TEMPERATURE,
                None,
                "celsius",
                Quality.ABSENT,
                t,
                wall,
                reason=_NO_PROBE,
                labels=labels,
            )
        )
    for phase, w in snap.pdu_power_w.items():
        add("pdu", f"power.{phase}", SensorKind.POWER, "watts", w, phase=phase)
    cdu = snap.cdu
    if not cdu.answering:
        return out
    add("cdu", "supply", SensorKind.COOLANT_SUPPLY_TEMPERATURE, "celsius", cdu.supply_c)
    add("cdu", "return", SensorKind.COOLANT_RETURN_TEMPERATURE, "celsius", cdu.return_c)
    add("cdu", "flow", SensorKind.COOLANT_FLOW, "liters_per_minute", cdu.flow_lpm)
    add(
        "cdu",
        "differential_pressure",
        SensorKind.COOLANT_DIFFERENTIAL_PRESSURE,
        "kilopascals",
        cdu.differential_pressure_kpa,
    )
    add("cdu", "pump_speed", SensorKind.PUMP_SPEED, "percent", cdu.pump_speed_pct)
    add("cdu", "pump_running", SensorKind.PUMP_STATE, "bool", 1.0 if cdu.pump_running else 0.0)
    add("cdu", "leak", SensorKind.LEAK, "bool", 1.0 if cdu.leak else 0.0)
    return out


def scenario_readings(
    scenario: Scenario | str,
    *,
    seed: int | None = None,
    interval_s: float = 1.0,
    rack_interval_s: float = 5.0,
    rack: str = RACK_NAME,
    wall_epoch: float = WALL_EPOCH,
    gpus: bool = True,
    rack_sources: bool = True,
) -> tuple[Header, Iterator[Reading]]:
    """The header and the readings of one whole run, in time order."""
    sc = load_scenario(scenario) if isinstance(scenario, str) else scenario
    header = header_for(sc, rack, seed)

    def readings() -> Iterator[Reading]:
        sim = RackSimulator(sc, seed=seed)
        steps = int(sc.duration_s / interval_s + 1e-9)
        every = max(1, round(rack_interval_s / interval_s))
        for k in range(steps + 1):
            sim.run_until(k * interval_s)
            snap = sim.snapshot()
            if gpus:
                yield from gpu_readings(snap, sc, wall_epoch)
            if rack_sources and k % every == 0:
                yield from rack_readings(snap, rack, wall_epoch, sc.rack.empty_probe_slots)

    return header, readings()


def write_trace(scenario: Scenario | str, out: TextIO, **options: object) -> int:
    """Write a scenario run as a trace to ``out``; returns the number of lines."""
    header, readings = scenario_readings(scenario, **options)  # type: ignore[arg-type]
    out.write(encode_header(header.racks, header.meta) + "\n")
    lines = 1
    for r in readings:
        out.write(encode_reading(r) + "\n")
        lines += 1
    return lines
