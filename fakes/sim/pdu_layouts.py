"""A simulated rack PDU laid out in one vendor's MIB, so a site's own profile choice is exercised.

Each layout maps a RackSnapshot to the OIDs a real PDU of that family serves,
in that MIB's units, matching the shipped profile of the same id in
adapters/sensors/profiles (sysObjectID under its ``match`` prefix): inlet probes
bottom to top (RackSnapshot.inlet_c) and per-phase current, voltage and power.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fakes.sim.thermal import RackSnapshot
from fakes.snmp_agent import (
    PROBE_IDS,
    SYS_DESCR,
    SYS_OBJECT_ID,
    OidTuple,
    Value,
    oid,
    sentry4_values,
)

Values = dict[OidTuple, Value]
VOLTS = 230.0


@dataclass(frozen=True, slots=True)
class PduLayout:
    """One vendor MIB: its profile id, how its probes are labelled, and its values."""

    profile: str
    probe_ids: Callable[[int], list[str]]  # probe labels as the profile reports them
    values: Callable[[RackSnapshot], Values]

    def probe_positions(self, snap: RackSnapshot) -> dict[str, str]:
        """Probe label -> the simulator's height label, for a source's ``probe_positions``."""
        return dict(zip(self.probe_ids(len(snap.inlet_c)), snap.inlet_c, strict=True))


_APC = "1.3.6.1.4.1.318.1.1"


def apc_rpdu2_values(snap: RackSnapshot) -> Values:
    """PowerNet-MIB: rPDULoadStatusTable, rPDU2 device/phase status, rPDU2 T/H probes."""
    v: Values = {
        SYS_DESCR: b"APC Web/SNMP Management Card (rackguard simulated rPDU2)",
        SYS_OBJECT_ID: oid("1.3.6.1.4.1.318.1.3.4.6"),
        oid(f"{_APC}.26.4.3.1.5.1"): round(sum(snap.pdu_power_w.values()) / 10),  # 0.01 kW
        oid(f"{_APC}.26.4.3.1.9.1"): 0,  # energy, tenths of kWh
    }
    for i, phase in enumerate(sorted(snap.pdu_power_w), start=1):
        v[oid(f"{_APC}.12.2.3.1.1.2.{i}")] = round(snap.pdu_current_a[phase] * 10)  # 0.1 A
        v[oid(f"{_APC}.12.2.3.1.1.4.{i}")] = i  # phase number
        v[oid(f"{_APC}.12.2.3.1.1.5.{i}")] = 0  # bank 0: the phase total
        v[oid(f"{_APC}.26.6.3.1.3.{i}")] = i
        v[oid(f"{_APC}.26.6.3.1.6.{i}")] = round(VOLTS)
    for i, label in enumerate(snap.inlet_c, start=1):
        v[oid(f"{_APC}.26.10.2.2.1.3.{i}")] = f"Inlet {label}".encode()
        v[oid(f"{_APC}.26.10.2.2.1.8.{i}")] = round(snap.inlet_c[label] * 10)  # 0.1 C
        v[oid(f"{_APC}.26.10.2.2.1.10.{i}")] = 40  # % RH
    return v


_RPX = "1.3.6.1.4.1.13742.6"
_DIGITS = 1  # every Raritan measurement here carries one decimal digit


def raritan_px2_values(snap: RackSnapshot) -> Values:
    """PDU2-MIB: inlet sensors (current, voltage, power) and external temperature probes."""
    total_w = sum(snap.pdu_power_w.values())
    total_a = sum(snap.pdu_current_a.values())
    v: Values = {
        SYS_DESCR: b"Raritan PX2 (rackguard simulated)",
        SYS_OBJECT_ID: oid(_RPX),
    }
    for sensor_type, value in ((1, total_a), (4, VOLTS), (5, total_w), (8, 0.0)):
        v[oid(f"{_RPX}.3.3.4.1.7.1.1.{sensor_type}")] = _DIGITS
        v[oid(f"{_RPX}.5.2.3.1.4.1.1.{sensor_type}")] = round(value * 10**_DIGITS)
    for i, label in enumerate(snap.inlet_c, start=1):
        v[oid(f"{_RPX}.3.6.3.1.2.1.{i}")] = 10  # temperature
        v[oid(f"{_RPX}.3.6.3.1.4.1.{i}")] = f"Inlet {label}".encode()
        v[oid(f"{_RPX}.3.6.3.1.17.1.{i}")] = _DIGITS
        v[oid(f"{_RPX}.5.5.3.1.4.1.{i}")] = round(snap.inlet_c[label] * 10**_DIGITS)
    return v


def _numbered(n: int) -> list[str]:
    return [str(i) for i in range(1, n + 1)]


LAYOUTS: dict[str, PduLayout] = {
    "apc-rpdu2": PduLayout("apc-rpdu2", _numbered, apc_rpdu2_values),
    "raritan-px2": PduLayout("raritan-px2", _numbered, raritan_px2_values),
    "sentry4": PduLayout("sentry4", lambda n: list(PROBE_IDS[:n]), sentry4_values),
}
