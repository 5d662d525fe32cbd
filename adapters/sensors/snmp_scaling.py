"""Raw SNMP values to engineering units, or the reason they cannot be trusted."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from adapters.sensors.snmp_profiles import Scale, SensorSpec


@dataclass(frozen=True, slots=True)
class Missing:
    """An SNMP exception value or error in place of a value (noSuchObject, ...)."""

    reason: str


# What a client hands over per OID: a number, the bytes of an OctetString, or Missing.
RawValue = int | bytes | Missing


@dataclass(frozen=True, slots=True)
class Conversion:
    """A sensor's arithmetic, fixed at connect: value = raw / divisor * multiplier + offset."""

    divisor: float
    multiplier: float
    offset: float
    fahrenheit: bool
    sentinels: frozenset[int]
    sentinel_means: str
    low: float | None
    high: float | None
    unit: str

    def is_sentinel(self, raw: RawValue) -> bool:
        """True for a raw value the MIB documents as "no value" (see sentinels)."""
        if isinstance(raw, bytes):
            number = _number_from_text(raw)
            return number is not None and number.is_integer() and int(number) in self.sentinels
        return isinstance(raw, int) and raw in self.sentinels

    def apply(self, raw: RawValue) -> float | str:
        """The value in the sensor's unit, or a reason string when it is BAD."""
        if isinstance(raw, Missing):
            return raw.reason
        if isinstance(raw, bytes):
            number = _number_from_text(raw)
            if number is None:
                return f"not a number: OctetString {_show(raw)}"
            if number.is_integer() and int(number) in self.sentinels:
                return f"{self.sentinel_means} (sentinel {int(number)})"
        else:
            if raw in self.sentinels:
                return f"{self.sentinel_means} (sentinel {raw})"
            number = float(raw)
        value = number / self.divisor * self.multiplier + self.offset
        if self.fahrenheit:
            value = (value - 32.0) * 5.0 / 9.0
        if not math.isfinite(value):
            return f"not a finite number: {value}"
        if (self.low is not None and value < self.low) or (
            self.high is not None and value > self.high
        ):
            return (
                f"out of range: {value:g} {self.unit} (raw {number:g};"
                f" plausible range {_bound(self.low)}..{_bound(self.high)})"
            )
        return value


def _bound(x: float | None) -> str:
    return "" if x is None else f"{x:g}"


def _show(raw: bytes) -> str:
    text = raw[:32].decode("ascii", "backslashreplace")
    return repr(text + ("..." if len(raw) > 32 else ""))


def _number_from_text(raw: bytes) -> float | None:
    """Some agents send numbers as text ('23.5'); anything else is garbage."""
    try:
        text = raw.decode("ascii").strip()
        return float(text) if text else None
    except (UnicodeDecodeError, ValueError):
        return None


def scale_factor(scale: Scale, text: str) -> tuple[float, float] | str:
    """(multiplier, divisor) a scale field contributes, or why it is unusable.

    Dividing by a power of ten keeps 229 / 10 == 22.9 exact where 229 * 0.1 is not.
    """
    try:
        n = int(text.strip())
    except ValueError:
        return f"scale field {scale.field!r} is not an integer: {text!r}"
    if scale.mode == "decimal_digits":  # value has n decimals: 235, 1 -> 23.5
        return (1.0, 10.0**n) if n >= 0 else (10.0**-n, 1.0)
    if scale.mode == "signed_factor":  # Rittal CMC III: -100 -> /100, 10 -> *10
        if n == 0:
            return f"scale field {scale.field!r} is 0"
        return (1.0, float(-n)) if n < 0 else (float(n), 1.0)
    if scale.mode == "divisor":  # APC coolingUnit tables: 215, 10 -> 21.5
        if n <= 0:
            return f"scale field {scale.field!r} is {n}, not a divisor"
        return (1.0, float(n))
    # si_prefix (ENTITY-SENSOR-MIB): 9 = units, 8 = milli, 10 = kilo, ...
    exponent = 3 * (n - 9)
    return (1.0, 10.0**-exponent) if exponent < 0 else (10.0**exponent, 1.0)


def conversion(spec: SensorSpec, fields: Mapping[str, str]) -> Conversion | str:
    """The conversion for one sensor of one row, or why its scale cannot be known."""
    multiplier, divisor = spec.multiplier, spec.divisor
    for scale in spec.scales:
        factor = scale_factor(scale, fields.get(scale.field, ""))
        if isinstance(factor, str):
            return factor
        multiplier *= factor[0]
        divisor *= factor[1]
    return Conversion(
        divisor=divisor,
        multiplier=multiplier,
        offset=spec.offset,
        fahrenheit=spec.transform == "fahrenheit_to_celsius",
        sentinels=spec.sentinels,
        sentinel_means=spec.sentinel_means,
        low=spec.low,
        high=spec.high,
        unit=spec.unit,
    )
