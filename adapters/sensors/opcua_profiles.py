"""CDU profiles (which OPC-UA variables mean what) and engineering units, loaded from TOML data.

A profile names a root object (a browse path from the Objects folder) and, per
variable, a browse path below it, the sensor kind, the unit the server uses when it
does not say, and a sanity range. Browse names are written ``alias:Name``; each alias
maps to a namespace URI, so paths survive servers that number namespaces differently
(the index is looked up in the server's NamespaceArray at every connect).

Every value is normalised to one unit per kind: celsius, liters_per_minute,
kilopascals, percent; pump state and leak are 1/0 ("bool"); an alarm is 1/0 or an
OPC-UA severity 0-1000 ("severity").
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from types import MappingProxyType
from typing import Any, Literal

from adapters.errors import SourceSetupError
from policies.model import SensorKind

Transform = Literal["value", "nonzero"]
PROFILE_PACKAGE = "adapters.sensors"
PROFILE_FOLDER = "cdu_profiles"


@dataclass(frozen=True, slots=True)
class Unit:
    """How a server unit converts to rackguard's unit: ``canonical = raw * scale + offset``."""

    name: str
    canonical: str
    scale: float = 1.0
    offset: float = 0.0
    unece: str = ""  # UN/CEFACT Common Code, as OPC-UA EUInformation.UnitId carries it

    def convert(self, raw: float) -> float:
        """The value in the canonical unit."""
        return raw * self.scale + self.offset


UNITS: Mapping[str, Unit] = MappingProxyType(
    {
        u.name: u
        for u in (
            Unit("celsius", "celsius", unece="CEL"),
            Unit("kelvin", "celsius", offset=-273.15, unece="KEL"),
            Unit("fahrenheit", "celsius", scale=5 / 9, offset=-32 * 5 / 9, unece="FAH"),
            Unit("liters_per_minute", "liters_per_minute", unece="L2"),
            Unit("cubic_meters_per_hour", "liters_per_minute", scale=1000 / 60, unece="MQH"),
            Unit("kilopascals", "kilopascals", unece="KPA"),
            Unit("bar", "kilopascals", scale=100.0, unece="BAR"),
            Unit("millibar", "kilopascals", scale=0.1, unece="MBR"),
            Unit("pascals", "kilopascals", scale=0.001, unece="PAL"),
            Unit("psi", "kilopascals", scale=6.894757, unece="PS"),
            Unit("percent", "percent", unece="P1"),
            Unit("bool", "bool"),
            Unit("severity", "severity"),
        )
    }
)


def unece_code(code: str) -> int:
    """The integer OPC-UA puts in EUInformation.UnitId for a UN/CEFACT code (e.g. CEL)."""
    value = 0
    for ch in code:
        value = (value << 8) | ord(ch)
    return value


UNITS_BY_UNECE: Mapping[int, Unit] = MappingProxyType(
    {unece_code(u.unece): u for u in UNITS.values() if u.unece}
)

# The canonical unit and the sanity range (canonical units) of each CDU kind.
KIND_UNITS: Mapping[SensorKind, tuple[str, float, float]] = MappingProxyType(
    {
        SensorKind.COOLANT_SUPPLY_TEMPERATURE: ("celsius", -20.0, 150.0),
        SensorKind.COOLANT_RETURN_TEMPERATURE: ("celsius", -20.0, 150.0),
        SensorKind.COOLANT_FLOW: ("liters_per_minute", 0.0, 100_000.0),
        SensorKind.COOLANT_DIFFERENTIAL_PRESSURE: ("kilopascals", -2_000.0, 10_000.0),
        SensorKind.COOLANT_PRESSURE: ("kilopascals", -100.0, 10_000.0),
        SensorKind.PUMP_SPEED: ("percent", 0.0, 150.0),
        SensorKind.PUMP_STATE: ("bool", 0.0, 1.0),
        SensorKind.LEAK: ("bool", 0.0, 1.0),
        SensorKind.ALARM: ("severity", 0.0, 1000.0),
    }
)


@dataclass(frozen=True, slots=True)
class PathElement:
    """One browse name of a path: namespace alias (or a numeric index) and name."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}:{self.name}"


def parse_path(text: str) -> tuple[PathElement, ...]:
    """``"tcd:DeviceZone_1/tcd:TemperatureMainLine"`` as elements; ValueError when malformed."""
    elements: list[PathElement] = []
    for part in text.strip().strip("/").split("/"):
        alias, sep, name = part.partition(":")
        if not sep or not alias or not name:
            raise ValueError(f"browse path element {part!r} must be written alias:Name")
        elements.append(PathElement(alias, name))
    return tuple(elements)


@dataclass(frozen=True, slots=True)
class VariableSpec:
    """One CDU variable: what it measures and where it is below the root object."""

    key: str  # sensor id suffix: cdu.<key>
    kind: SensorKind
    path: tuple[PathElement, ...]
    unit: Unit  # used when the server reports no EngineeringUnits
    transform: Transform = "value"  # "nonzero": 1 when the raw value is not 0 (e.g. RPM -> running)

    @property
    def canonical_unit(self) -> str:
        """The unit rackguard reports this variable in."""
        return "bool" if self.transform == "nonzero" else self.unit.canonical


@dataclass(frozen=True, slots=True)
class CduProfile:
    """A mapping from CDU telemetry to OPC-UA variables, as loaded from a profile file."""

    name: str
    description: str
    namespaces: Mapping[str, str]  # alias -> namespace URI
    root: tuple[PathElement, ...]  # default browse path of the CDU object from Objects
    variables: tuple[VariableSpec, ...]

    def variable(self, key: str) -> VariableSpec:
        """The variable called ``key``; KeyError when the profile has none."""
        for v in self.variables:
            if v.key == key:
                return v
        raise KeyError(key)


def profile_names() -> list[str]:
    """The profiles shipped with rackguard (file stems under cdu_profiles/)."""
    folder = resources.files(PROFILE_PACKAGE) / PROFILE_FOLDER
    return sorted(
        p.name.removesuffix(".toml") for p in folder.iterdir() if p.name.endswith(".toml")
    )


def load_profile(name: str) -> CduProfile:
    """A shipped profile by name; SourceSetupError naming the known ones when missing or broken."""
    path = resources.files(PROFILE_PACKAGE) / PROFILE_FOLDER / f"{name}.toml"
    if not path.is_file():
        known = ", ".join(profile_names())
        raise SourceSetupError(f"unknown CDU profile {name!r} (known: {known})")
    try:
        return parse_profile(tomllib.loads(path.read_text(encoding="utf-8")), origin=name)
    except (tomllib.TOMLDecodeError, ValueError) as err:
        raise SourceSetupError(f"CDU profile {name!r} is broken: {err}") from err


def parse_profile(data: Mapping[str, Any], *, origin: str = "<profile>") -> CduProfile:
    """Build a profile from parsed TOML; ValueError naming the key on any problem."""
    namespaces = data.get("namespaces", {})
    if not isinstance(namespaces, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in namespaces.items()
    ):
        raise ValueError(f"{origin}: namespaces must be a table of alias = URI strings")
    variables: list[VariableSpec] = []
    raw_vars = data.get("variables", {})
    if not isinstance(raw_vars, dict) or not raw_vars:
        raise ValueError(f"{origin}: [variables.*] tables are required")
    for key, spec in raw_vars.items():
        variables.append(_variable(f"{origin}: variables.{key}", key, spec, namespaces))
    root = parse_path(str(data.get("root", "")))
    _check_aliases(f"{origin}: root", root, namespaces)
    return CduProfile(
        name=str(data.get("name", origin)),
        description=str(data.get("description", "")),
        namespaces=MappingProxyType(dict(namespaces)),
        root=root,
        variables=tuple(variables),
    )


def _variable(where: str, key: str, spec: Any, namespaces: Mapping[str, str]) -> VariableSpec:
    if not isinstance(spec, dict):
        raise ValueError(f"{where}: must be a table")
    try:
        kind = SensorKind(spec["kind"])
    except (KeyError, ValueError) as err:
        raise ValueError(f"{where}: missing or unknown kind: {err}") from err
    if kind not in KIND_UNITS:
        raise ValueError(f"{where}: kind {kind.value!r} is not a CDU kind")
    try:
        path = parse_path(spec["path"])
        unit = UNITS[spec.get("unit", KIND_UNITS[kind][0])]
    except KeyError as err:
        raise ValueError(f"{where}: missing or unknown {err}") from err
    transform = spec.get("transform", "value")
    if transform not in ("value", "nonzero"):
        raise ValueError(f"{where}: transform must be 'value' or 'nonzero', got {transform!r}")
    expected = KIND_UNITS[kind][0]
    got = "bool" if transform == "nonzero" else unit.canonical
    if got != expected and not (kind is SensorKind.ALARM and got == "bool"):
        raise ValueError(f"{where}: unit {unit.name!r} does not fit kind {kind.value!r}")
    _check_aliases(where, path, namespaces)
    return VariableSpec(key, kind, path, unit, transform)


def _check_aliases(
    where: str, path: tuple[PathElement, ...], namespaces: Mapping[str, str]
) -> None:
    for element in path:
        if element.namespace not in namespaces and not element.namespace.isdigit():
            raise ValueError(f"{where}: namespace alias {element.namespace!r} is not declared")
