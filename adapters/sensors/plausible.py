"""Physically plausible ranges per sensor kind, in rackguard's unit for that kind.

One table for every facility adapter (SNMP profiles, OPC-UA profiles): a value
outside its kind's range is BAD with the reason, never GOOD. The ranges are wide
enough for any real rack or coolant loop and narrow enough to catch the usual
mistakes: a Fahrenheit value read as Celsius (68 "°C" inlet air), a missing
divisor (235 °C for 23.5), a raw count taken as litres.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from policies.model import SensorKind

# kind -> (unit, low, high). A sensor whose profile names another unit (e.g.
# volt_amperes for a power column) gets no default range: the profile must say.
PLAUSIBLE: Mapping[SensorKind, tuple[str, float, float]] = MappingProxyType(
    {
        # ASHRAE's allowable envelope for IT inlet air is 5-45 °C; 0-60 leaves room.
        SensorKind.INLET_TEMPERATURE: ("celsius", 0.0, 60.0),
        SensorKind.AIR_TEMPERATURE: ("celsius", -20.0, 80.0),
        SensorKind.TEMPERATURE: ("celsius", -40.0, 150.0),
        SensorKind.HUMIDITY: ("percent", 0.0, 100.0),
        # Water or glycol loops of a datacenter: never boiling, rarely below 0.
        SensorKind.COOLANT_SUPPLY_TEMPERATURE: ("celsius", -10.0, 95.0),
        SensorKind.COOLANT_RETURN_TEMPERATURE: ("celsius", -10.0, 95.0),
        SensorKind.COOLANT_FLOW: ("liters_per_minute", 0.0, 20_000.0),
        SensorKind.COOLANT_PRESSURE: ("kilopascals", -100.0, 2_500.0),
        SensorKind.COOLANT_DIFFERENTIAL_PRESSURE: ("kilopascals", -500.0, 2_500.0),
        SensorKind.PRESSURE: ("kilopascals", -100.0, 2_500.0),
        SensorKind.POWER: ("watts", 0.0, 1_000_000.0),
        SensorKind.CURRENT: ("amperes", 0.0, 10_000.0),
        SensorKind.VOLTAGE: ("volts", 0.0, 1_000.0),
        # A counter since installation: never negative (a MIB's -1 "not measured" is not).
        SensorKind.ENERGY: ("kilowatt_hours", 0.0, 1e9),
        SensorKind.PUMP_SPEED: ("percent", 0.0, 150.0),
    }
)

# Ranges for a kind measured in a second unit that cannot be converted to the first.
ALTERNATE: Mapping[tuple[SensorKind, str], tuple[float, float]] = MappingProxyType(
    {
        (SensorKind.PUMP_SPEED, "rpm"): (0.0, 100_000.0),
        (SensorKind.ENERGY, "watt_hours"): (0.0, 1e12),
        (SensorKind.POWER, "volt_amperes"): (0.0, 1_000_000.0),
    }
)


def plausible_range(kind: SensorKind, unit: str) -> tuple[float, float] | None:
    """(low, high) for a kind in this unit, or None when rackguard knows no range for it."""
    entry = PLAUSIBLE.get(kind)
    if entry is not None and entry[0] == unit:
        return entry[1], entry[2]
    return ALTERNATE.get((kind, unit))
