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

import dataclasses
import logging
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from adapters.errors import SourceSetupError
from adapters.sensors.plausible import PLAUSIBLE, plausible_range
from policies.model import SensorKind

log = logging.getLogger(__name__)

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
            Unit("rpm", "rpm", unece="RPM"),  # pump speed: revolutions per minute
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

_CDU_KINDS = (
    SensorKind.COOLANT_SUPPLY_TEMPERATURE,
    SensorKind.COOLANT_RETURN_TEMPERATURE,
    SensorKind.COOLANT_FLOW,
    SensorKind.COOLANT_DIFFERENTIAL_PRESSURE,
    SensorKind.COOLANT_PRESSURE,
    SensorKind.PUMP_SPEED,
)
# The canonical unit and the plausible range (canonical units) of each CDU kind;
# the physical ones are adapters/sensors/plausible.py's, shared with SNMP.
KIND_UNITS: Mapping[SensorKind, tuple[str, float, float]] = MappingProxyType(
    {
        **{kind: PLAUSIBLE[kind] for kind in _CDU_KINDS},
        SensorKind.PUMP_STATE: ("bool", 0.0, 1.0),
        SensorKind.LEAK: ("bool", 0.0, 1.0),
        SensorKind.ALARM: ("severity", 0.0, 1000.0),
    }
)


def unit_fits(kind: SensorKind, unit: Unit) -> bool:
    """Whether values of this kind may be stated in this unit (e.g. pump speed in rpm)."""
    expected = KIND_UNITS[kind][0]
    if unit.canonical == expected:
        return True
    if kind is SensorKind.ALARM and unit.canonical == "bool":
        return True
    return plausible_range(kind, unit.canonical) is not None


def kind_range(kind: SensorKind, canonical: str) -> tuple[float, float]:
    """The plausible range of a kind in one of its canonical units."""
    found = plausible_range(kind, canonical)
    if found is not None:
        return found
    _, low, high = KIND_UNITS[kind]
    return low, high


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
        """The unit rackguard reports this variable in, when the server states none."""
        return "bool" if self.transform == "nonzero" else self.unit.canonical


@dataclass(frozen=True, slots=True)
class CduProfile:
    """A mapping from CDU telemetry to OPC-UA variables, as loaded from a profile file."""

    name: str
    description: str
    namespaces: Mapping[str, str]  # alias -> namespace URI
    root: tuple[PathElement, ...]  # default browse path of the CDU object from Objects
    variables: tuple[VariableSpec, ...]

    @property
    def variables_keys(self) -> tuple[str, ...]:
        """The variables' keys, in profile order."""
        return tuple(v.key for v in self.variables)

    def variable(self, key: str) -> VariableSpec:
        """The variable called ``key``; KeyError when the profile has none."""
        for v in self.variables:
            if v.key == key:
                return v
        raise KeyError(key)


_PROFILE_KEYS = frozenset({"name", "description", "root", "namespaces", "variables"})
_VARIABLE_KEYS = frozenset({"kind", "path", "unit", "transform"})


def _site_file(name: str, profile_dir: Path | None) -> Path | None:
    if profile_dir is None:
        return None
    path = profile_dir / f"{name}.toml"
    return path if path.is_file() else None


def profile_names(profile_dir: Path | None = None) -> list[str]:
    """The profiles a source may name: the site's (profile_dir/*.toml) and the shipped ones."""
    folder = resources.files(PROFILE_PACKAGE) / PROFILE_FOLDER
    names = {p.name.removesuffix(".toml") for p in folder.iterdir() if p.name.endswith(".toml")}
    if profile_dir is not None and profile_dir.is_dir():
        names |= {p.stem for p in profile_dir.glob("*.toml")}
    return sorted(names)


def load_profile(name: str, profile_dir: Path | None = None) -> CduProfile:
    """A profile by name, the site's profile_dir first; SourceSetupError naming file and key."""
    if profile_dir is not None and not profile_dir.is_dir():
        raise SourceSetupError(f"{profile_dir}: profile_dir is not a directory")
    site = _site_file(name, profile_dir)
    shipped = resources.files(PROFILE_PACKAGE) / PROFILE_FOLDER / f"{name}.toml"
    if site is not None:
        origin = str(site)
        if shipped.is_file():
            log.info("CDU profile %s from %s replaces the shipped one", name, site)
        try:
            text = site.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise SourceSetupError(f"{site}: cannot be read: {err}") from err
    elif shipped.is_file():
        origin = f"cdu_profiles/{name}.toml"
        text = shipped.read_text(encoding="utf-8")
    else:
        known = ", ".join(profile_names(profile_dir))
        raise SourceSetupError(f"unknown CDU profile {name!r} (known: {known})")
    try:
        return parse_profile(tomllib.loads(text), origin=origin)
    except tomllib.TOMLDecodeError as err:
        raise SourceSetupError(f"{origin}: not valid TOML: {err}") from err
    except ValueError as err:
        raise SourceSetupError(str(err)) from err


def _unknown(where: str, data: Mapping[str, Any], allowed: frozenset[str]) -> None:
    """A mistyped key is reported as itself, before anything it left missing."""
    for key in sorted(set(data) - allowed):
        raise ValueError(
            f"{where}{key}: unknown key (known keys here: {', '.join(sorted(allowed))})"
        )


def parse_profile(data: Mapping[str, Any], *, origin: str = "<profile>") -> CduProfile:
    """Build a profile from parsed TOML; ValueError naming the file and key on any problem."""
    _unknown(f"{origin}: ", data, _PROFILE_KEYS)
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
    try:
        root = parse_path(str(data.get("root", "")))
    except ValueError as err:
        raise ValueError(f"{origin}: root: {err}") from err
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
    _unknown(f"{where}.", spec, _VARIABLE_KEYS)
    try:
        kind = SensorKind(spec["kind"])
    except (KeyError, ValueError) as err:
        raise ValueError(f"{where}.kind: missing or unknown kind: {err}") from err
    if kind not in KIND_UNITS:
        raise ValueError(f"{where}.kind: {kind.value!r} is not a CDU kind")
    try:
        path = parse_path(spec["path"])
    except KeyError:
        raise ValueError(f"{where}.path: required key is missing") from None
    except ValueError as err:
        raise ValueError(f"{where}.path: {err}") from err
    unit_name = spec.get("unit", KIND_UNITS[kind][0])
    if unit_name not in UNITS:
        raise ValueError(f"{where}.unit: unknown unit {unit_name!r} (known: {', '.join(UNITS)})")
    unit = UNITS[unit_name]
    transform = spec.get("transform", "value")
    if transform not in ("value", "nonzero"):
        raise ValueError(f"{where}.transform: must be 'value' or 'nonzero', got {transform!r}")
    if transform == "value" and not unit_fits(kind, unit):
        raise ValueError(f"{where}.unit: {unit.name!r} does not fit kind {kind.value!r}")
    _check_aliases(where, path, namespaces)
    return VariableSpec(key, kind, path, unit, transform)


def _check_aliases(
    where: str, path: tuple[PathElement, ...], namespaces: Mapping[str, str]
) -> None:
    for element in path:
        if element.namespace not in namespaces and not element.namespace.isdigit():
            raise ValueError(f"{where}: namespace alias {element.namespace!r} is not declared")


# Keys a source may map although its profile lacks them (e.g. `leak` for the TCD
# model): the generic profile's, with its kinds and default units.
def standard_variables() -> Mapping[str, VariableSpec]:
    """The generic profile's variables by key."""
    return {v.key: v for v in load_profile("generic").variables}


def customised(
    profile: CduProfile,
    *,
    nodes: Mapping[str, str],
    paths: Mapping[str, str],
    units: Mapping[str, str],
) -> CduProfile:
    """The profile with a source's per-variable browse paths and units applied.

    A key the profile lacks may be added with a NodeId (`nodes`) or a browse path
    (`paths`) if it is a standard key (standard_variables). ValueError names
    ``paths.KEY`` / ``units.KEY`` / ``nodes.KEY``.
    """
    by_key = {v.key: v for v in profile.variables}
    standard = standard_variables()
    for table, keys in (("nodes", nodes), ("paths", paths), ("units", units)):
        for key in keys:
            if key in by_key:
                continue
            if key not in standard or table == "units":
                known = sorted(set(by_key) | (set(standard) if table != "units" else set()))
                raise ValueError(
                    f"{table}.{key}: {key!r} is not a variable of profile {profile.name!r}"
                    f" (known: {', '.join(known)})"
                )
            if table == "units" or (key not in nodes and key not in paths):
                continue
            base = standard[key]
            by_key[key] = dataclasses.replace(base, path=())
    for key, text in paths.items():
        try:
            path = parse_path(text)
        except ValueError as err:
            raise ValueError(f"paths.{key}: {err}") from err
        by_key[key] = dataclasses.replace(by_key[key], path=path)
    for key, name in units.items():
        if name not in UNITS:
            raise ValueError(f"units.{key}: unknown unit {name!r} (known: {', '.join(UNITS)})")
        var = by_key[key]
        if not unit_fits(var.kind, UNITS[name]):
            raise ValueError(f"units.{key}: {name!r} does not fit kind {var.kind.value!r}")
        by_key[key] = dataclasses.replace(var, unit=UNITS[name])
    order = [v.key for v in profile.variables] + [
        k for k in by_key if k not in profile.variables_keys
    ]
    return dataclasses.replace(profile, variables=tuple(by_key[k] for k in order))
