"""PDU and cooling-unit profiles: TOML data that maps a device's OIDs to sensors.

A profile names the sysObjectID prefixes it serves, scalar sensors (one OID each) and
tables (a column walked once at connect gives the rows; other columns read once give
each row's text fields; value columns are polled). docs/pdu-profiles.md is the
operator's guide to the format; the shipped profiles live in profiles/*.toml.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from adapters.sensors.plausible import plausible_range
from policies.model import SensorKind

log = logging.getLogger(__name__)

_OID = re.compile(r"^\.?[0-9]+(\.[0-9]+)+$")
_TEMPLATE_REF = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
SCALE_MODES = ("decimal_digits", "signed_factor", "si_prefix", "divisor")
TRANSFORMS = ("fahrenheit_to_celsius",)

_TEMPERATURE_KINDS = frozenset(
    {
        SensorKind.INLET_TEMPERATURE,
        SensorKind.AIR_TEMPERATURE,
        SensorKind.TEMPERATURE,
        SensorKind.COOLANT_SUPPLY_TEMPERATURE,
        SensorKind.COOLANT_RETURN_TEMPERATURE,
    }
)
# Unit when a profile names none; kinds missing here must name their unit.
DEFAULT_UNITS: Mapping[SensorKind, str] = {
    **dict.fromkeys(_TEMPERATURE_KINDS, "celsius"),
    SensorKind.HUMIDITY: "percent",
    SensorKind.POWER: "watts",
    SensorKind.CURRENT: "amperes",
    SensorKind.VOLTAGE: "volts",
    SensorKind.ENERGY: "kilowatt_hours",
    SensorKind.COOLANT_FLOW: "liters_per_minute",
}
# Units a profile may name that are converted on read: value -> (rackguard's unit, transform).
CONVERTED_UNITS: Mapping[str, tuple[str, str]] = {
    "fahrenheit": ("celsius", "fahrenheit_to_celsius")
}
# The short word for a kind, usable as {class} in sensor id templates.
_CLASS_WORDS: Mapping[SensorKind, str] = {
    **dict.fromkeys(_TEMPERATURE_KINDS, "temperature"),
    SensorKind.COOLANT_FLOW: "flow",
    SensorKind.COOLANT_PRESSURE: "pressure",
    SensorKind.COOLANT_DIFFERENTIAL_PRESSURE: "differential_pressure",
}


def class_word(kind: SensorKind) -> str:
    """'temperature' for every temperature kind, else the kind's own name."""
    return _CLASS_WORDS.get(kind, kind.value)


class ProfileError(ValueError):
    """A profile file that cannot be used; the message names the file and the key."""


@dataclass(frozen=True, slots=True)
class Scale:
    """A divisor or factor read from a row field (e.g. a 'decimal digits' column)."""

    field: str
    mode: str  # one of SCALE_MODES


@dataclass(frozen=True, slots=True)
class StatusSpec:
    """A per-row status column polled with the value: other than a good state, the value is BAD."""

    column: str  # column OID (table; the row index is appended) or the OID (scalar)
    good: frozenset[int]
    names: Mapping[int, str] = field(default_factory=dict)  # state -> the MIB's name

    def reason(self, state: int) -> str:
        """Why a reading in this state is BAD."""
        name = self.names.get(state)
        return f"device reports status {name} ({state})" if name else f"device status {state}"


@dataclass(frozen=True, slots=True)
class SensorSpec:
    """How one value OID (scalar) or value column (table) becomes a Reading."""

    id: str  # template: {index}, {index1}.., fields, constants, labels, {class}
    kind: SensorKind
    unit: str
    value: str  # the OID (scalar) or the column OID (table; the row index is appended)
    divisor: float = 1.0
    multiplier: float = 1.0
    offset: float = 0.0  # added after divisor and multiplier
    scales: tuple[Scale, ...] = ()
    transform: str = ""  # one of TRANSFORMS, applied last
    sentinels: frozenset[int] = frozenset()  # raw values the MIB gives for "no value"
    sentinel_means: str = "no probe fitted"  # what the MIB says such a value means
    low: float | None = None
    high: float | None = None
    labels: Mapping[str, str] = field(default_factory=dict)  # values are templates
    match: Mapping[str, re.Pattern[str]] = field(default_factory=dict)  # field -> regex
    status: StatusSpec | None = None
    skip: str = ""  # why rows this entry claims are deliberately not read (e.g. VA, var)


@dataclass(frozen=True, slots=True)
class TableSpec:
    """Rows found by walking one column at connect; each row yields its sensors."""

    id: str
    walk: str
    fields: Mapping[str, str]  # field name -> column OID, read once per row at connect
    constants: Mapping[str, str]  # name -> scalar OID, read once at connect
    where: Mapping[str, re.Pattern[str]]  # rows kept only where every field matches
    sensors: tuple[SensorSpec, ...]


@dataclass(frozen=True, slots=True)
class Profile:
    """One device family's sensors; matched by sysObjectID prefix."""

    id: str
    vendor: str
    model: str
    match: tuple[tuple[int, ...], ...]
    scalars: tuple[SensorSpec, ...]
    tables: tuple[TableSpec, ...]
    max_repetitions: int | None = None
    max_varbinds: int | None = None
    fallback: bool = False  # used when no other profile matches
    verified_with: str = ""
    products: str = ""  # the product lines whose tables the profile reads
    mib: str = ""  # the MIB modules and revisions the profile was checked against
    path: str = ""
    site: bool = False  # from the source's profile_dir (wins over a shipped profile)

    def matches(self, sys_object_id: tuple[int, ...]) -> int:
        """Length of the longest matching prefix, 0 when none matches."""
        best = 0
        for prefix in self.match:
            if sys_object_id[: len(prefix)] == prefix and len(prefix) > best:
                best = len(prefix)
        return best


def oid_tuple(text: str) -> tuple[int, ...]:
    """'1.3.6.1' or '.1.3.6.1' as a tuple of ints."""
    return tuple(int(p) for p in text.strip(".").split("."))


def template_names(template: str) -> set[str]:
    """The {names} a template refers to."""
    return set(_TEMPLATE_REF.findall(template))


def render(template: str, values: Mapping[str, str]) -> str:
    """Fill {name} references; an unknown name is left as is."""
    return _TEMPLATE_REF.sub(lambda m: values.get(m.group(1), m.group(0)), template)


class _Reader:
    """Typed access to one TOML table, naming the key path in every error."""

    def __init__(
        self, data: Mapping[str, Any], where: str, source: str, allowed: frozenset[str]
    ) -> None:
        self.data = data
        self.where = where
        self.source = source
        self.used: set[str] = set()
        # A mistyped key ("field" for "fields") is reported as itself, before the
        # table's other checks can blame something the typo left missing.
        unknown = sorted(set(data) - allowed)
        if unknown:
            raise self.fail(
                unknown[0], f"unknown key (known keys here: {', '.join(sorted(allowed))})"
            )

    def fail(self, key: str, message: str) -> ProfileError:
        path = f"{self.where}.{key}" if self.where else key
        return ProfileError(f"{self.source}: {path}: {message}")

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
        self.used.add(key)
        if key not in self.data:
            if default is ...:
                raise self.fail(key, "required key is missing")
            return default
        value = self.data[key]
        if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
            raise self.fail(key, f"must not be a boolean, got {value!r}")
        if not isinstance(value, kind):
            raise self.fail(key, f"has the wrong type ({type(value).__name__}): {value!r}")
        return value

    def oid(self, key: str, default: Any = ...) -> Any:
        value = self.get(key, str, default)
        if isinstance(value, str) and not _OID.match(value):
            raise self.fail(key, f"must be a numeric OID like '1.3.6.1.4.1', got {value!r}")
        return value.strip(".") if isinstance(value, str) else value

    def number(self, key: str, default: Any = ...) -> Any:
        value = self.get(key, (int, float), default)
        return float(value) if isinstance(value, int | float) else value

    def str_map(self, key: str, *, oids: bool = False) -> dict[str, str]:
        raw = self.get(key, dict, {})
        out: dict[str, str] = {}
        for name, value in raw.items():
            if not isinstance(value, str):
                raise self.fail(f"{key}.{name}", f"must be a string, got {value!r}")
            if oids and not _OID.match(value):
                raise self.fail(f"{key}.{name}", f"must be a numeric OID, got {value!r}")
            out[name] = value.strip(".") if oids else value
        return out

    def regex_map(self, key: str) -> dict[str, re.Pattern[str]]:
        out: dict[str, re.Pattern[str]] = {}
        for name, pattern in self.str_map(key).items():
            try:
                out[name] = re.compile(pattern)
            except re.error as err:
                raise self.fail(f"{key}.{name}", f"bad regular expression: {err}") from err
        return out

    def done(self) -> None:
        unknown = sorted(set(self.data) - self.used)
        if unknown:
            raise self.fail(unknown[0], "unknown key")


_SENSOR_KEYS = frozenset(
    {"id", "kind", "unit", "divisor", "multiplier", "offset", "scale", "transform", "sentinels"}
    | {"min", "max", "labels", "match", "status", "skip", "sentinel_means"}
)
_SCALE_KEYS = frozenset({"field", "mode"})
_STATUS_KEYS = frozenset({"oid", "column", "good", "names"})
_TABLE_KEYS = frozenset({"id", "walk", "fields", "constants", "where", "sensor"})
_PROFILE_KEYS = frozenset(
    {"id", "vendor", "model", "match", "sensor", "table", "max_repetitions", "max_varbinds"}
    | {"fallback", "verified_with", "products", "mib"}
)


def _status(r: _Reader, key: str) -> StatusSpec | None:
    raw = r.get("status", dict, None)
    if raw is None:
        return None
    sr = _Reader(raw, f"{r.where}.status", r.source, _STATUS_KEYS)
    column = sr.oid(key)
    good = sr.get("good", list)
    if not good or not all(isinstance(g, int) and not isinstance(g, bool) for g in good):
        raise sr.fail("good", "must list the integer states in which the value is usable")
    names: dict[int, str] = {}
    for state, name in sr.str_map("names").items():
        try:
            names[int(state)] = name
        except ValueError:
            raise sr.fail(f"names.{state}", "keys must be integer states") from None
    sr.done()
    return StatusSpec(column, frozenset(good), names)


def _sensor(r: _Reader, value_key: str, names: set[str]) -> SensorSpec:
    kind_text = r.get("kind", str)
    try:
        kind = SensorKind(kind_text)
    except ValueError:
        known = ", ".join(k.value for k in SensorKind)
        raise r.fail("kind", f"unknown kind {kind_text!r} (known: {known})") from None
    unit = r.get("unit", str, DEFAULT_UNITS.get(kind, ""))
    if not unit:
        raise r.fail("unit", f"required for kind {kind.value!r}")
    transform = r.get("transform", str, "")
    if transform and transform not in TRANSFORMS:
        raise r.fail("transform", f"must be one of {', '.join(TRANSFORMS)}, got {transform!r}")
    if unit in CONVERTED_UNITS:  # e.g. unit = "fahrenheit": reported in celsius
        unit, implied = CONVERTED_UNITS[unit]
        if transform and transform != implied:
            raise r.fail("transform", f"contradicts the unit (which implies {implied!r})")
        transform = implied
    if transform == "fahrenheit_to_celsius" and unit != "celsius":
        raise r.fail("unit", f"must be celsius (or fahrenheit) with {transform}, got {unit!r}")
    low_default, high_default = plausible_range(kind, unit) or (None, None)
    scales: list[Scale] = []
    for i, item in enumerate(r.get("scale", list, [])):
        if not isinstance(item, dict):
            raise r.fail(f"scale[{i}]", "must be a table {field = ..., mode = ...}")
        sr = _Reader(item, f"{r.where}.scale[{i}]", r.source, _SCALE_KEYS)
        mode = sr.get("mode", str)
        if mode not in SCALE_MODES:
            raise sr.fail("mode", f"must be one of {', '.join(SCALE_MODES)}, got {mode!r}")
        scales.append(Scale(sr.get("field", str), mode))
        sr.done()
    sentinels = r.get("sentinels", list, [])
    if not all(isinstance(s, int) and not isinstance(s, bool) for s in sentinels):
        raise r.fail("sentinels", "must be a list of integers (raw values)")
    sentinel_means = r.get("sentinel_means", str, "no probe fitted")
    if not sentinel_means.strip():
        raise r.fail("sentinel_means", "must say what a sentinel means, e.g. 'not measured'")
    divisor = r.number("divisor", 1.0)
    if divisor == 0:
        raise r.fail("divisor", "must not be 0")
    spec = SensorSpec(
        id=r.get("id", str),
        kind=kind,
        unit=unit,
        value=r.oid(value_key),
        divisor=divisor,
        multiplier=r.number("multiplier", 1.0),
        offset=r.number("offset", 0.0),
        scales=tuple(scales),
        transform=transform,
        sentinels=frozenset(sentinels),
        sentinel_means=sentinel_means,
        low=r.number("min", low_default),
        high=r.number("max", high_default),
        labels=r.str_map("labels"),
        match=r.regex_map("match"),
        status=_status(r, "column" if value_key == "value" else "oid"),
        skip=r.get("skip", str, ""),
    )
    label_names = set(spec.labels)
    for ref in template_names(spec.id) - names - label_names:
        raise r.fail("id", f"refers to {{{ref}}}, which is neither a field nor a label")
    for name, tmpl in spec.labels.items():
        for ref in template_names(tmpl) - names:
            raise r.fail(f"labels.{name}", f"refers to {{{ref}}}, which is not a field")
    for name in spec.match:
        if name not in names:
            raise r.fail(f"match.{name}", "is not a field of this table")
    for scale in spec.scales:
        if scale.field not in names:
            raise r.fail("scale", f"field {scale.field!r} is not a field of this table")
    r.done()
    return spec


_SCALAR_NAMES = {"class"}
_INDEX_NAMES = {"index", *(f"index{i}" for i in range(1, 17))}


def parse_profile(data: Mapping[str, Any], source: str) -> Profile:
    """A Profile from parsed TOML; ProfileError names the file and key of any problem."""
    r = _Reader(data, "", source, _PROFILE_KEYS)
    scalars = []
    for i, item in enumerate(r.get("sensor", list, [])):
        if not isinstance(item, dict):
            raise r.fail(f"sensor[{i}]", "must be a table")
        reader = _Reader(item, f"sensor[{i}]", source, _SENSOR_KEYS | {"oid"})
        scalars.append(_sensor(reader, "oid", _SCALAR_NAMES))
    tables = []
    for i, item in enumerate(r.get("table", list, [])):
        if not isinstance(item, dict):
            raise r.fail(f"table[{i}]", "must be a table")
        tr = _Reader(item, f"table[{i}]", source, _TABLE_KEYS)
        fields = tr.str_map("fields", oids=True)
        constants = tr.str_map("constants", oids=True)
        names = _SCALAR_NAMES | _INDEX_NAMES | set(fields) | set(constants)
        where = tr.regex_map("where")
        for name in where:
            if name not in fields:
                raise tr.fail(f"where.{name}", "is not a field of this table")
        sensors = []
        for j, s in enumerate(tr.get("sensor", list)):
            if not isinstance(s, dict):
                raise tr.fail(f"sensor[{j}]", "must be a table")
            reader = _Reader(s, f"table[{i}].sensor[{j}]", source, _SENSOR_KEYS | {"value"})
            sensors.append(_sensor(reader, "value", names))
        tables.append(
            TableSpec(
                id=tr.get("id", str, f"table{i}"),
                walk=tr.oid("walk"),
                fields=fields,
                constants=constants,
                where=where,
                sensors=tuple(sensors),
            )
        )
        tr.done()
    match = tuple(oid_tuple(m) for m in r.get("match", list, []))
    fallback = r.get("fallback", bool, False)
    if not match and not fallback:
        raise r.fail("match", "list at least one sysObjectID prefix (or set fallback = true)")
    max_rep = r.get("max_repetitions", int, None)
    max_vb = r.get("max_varbinds", int, None)
    if max_rep is not None and not 1 <= max_rep <= 100:
        raise r.fail("max_repetitions", f"must be 1..100, got {max_rep}")
    if max_vb is not None and not 1 <= max_vb <= 200:
        raise r.fail("max_varbinds", f"must be 1..200, got {max_vb}")
    profile = Profile(
        id=r.get("id", str),
        vendor=r.get("vendor", str, ""),
        model=r.get("model", str, ""),
        match=match,
        scalars=tuple(scalars),
        tables=tuple(tables),
        max_repetitions=max_rep,
        max_varbinds=max_vb,
        fallback=fallback,
        verified_with=r.get("verified_with", str, ""),
        products=r.get("products", str, ""),
        mib=r.get("mib", str, ""),
        path=source,
    )
    r.done()
    if not profile.scalars and not profile.tables:
        raise ProfileError(f"{source}: defines no [[sensor]] and no [[table]]")
    return profile


def load_profile_file(path: Path, *, site: bool = True) -> Profile:
    """Parse one profile file (a site's, unless told otherwise)."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise ProfileError(f"{path}: cannot be read: {err.strerror or err}") from err
    except UnicodeDecodeError as err:
        raise ProfileError(f"{path}: not UTF-8 text: {err}") from err
    except tomllib.TOMLDecodeError as err:
        raise ProfileError(f"{path}: not valid TOML: {err}") from err
    profile = parse_profile(data, str(path))
    return dataclasses.replace(profile, site=site)


def shipped_profiles() -> list[Profile]:
    """Every profile shipped in adapters/sensors/profiles."""
    out = []
    folder = resources.files("adapters.sensors") / "profiles"
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".toml"):
            data = tomllib.loads(entry.read_text(encoding="utf-8"))
            out.append(parse_profile(data, f"profiles/{entry.name}"))
    return out


def site_profiles(folder: Path) -> list[Profile]:
    """Every *.toml in a site's profile_dir; ProfileError for a broken file or a repeated id."""
    if not folder.is_dir():
        raise ProfileError(f"{folder}: profile_dir is not a directory")
    by_id: dict[str, Profile] = {}
    for path in sorted(folder.glob("*.toml")):
        profile = load_profile_file(path)
        if profile.id in by_id:
            raise ProfileError(
                f"{path}: id {profile.id!r} is already defined by {by_id[profile.id].path};"
                " each profile in profile_dir needs its own id"
            )
        by_id[profile.id] = profile
    return list(by_id.values())


def load_profiles(extra_dir: Path | None = None) -> list[Profile]:
    """The site's profiles from extra_dir, then the shipped ones whose id no site file took.

    Site profiles come first and win: over a shipped profile with the same id, and
    over one whose ``match`` is as specific (see select_profile).
    """
    site = site_profiles(extra_dir) if extra_dir is not None else []
    taken = {p.id: p for p in site}
    shipped = []
    for p in shipped_profiles():
        if p.id in taken:
            log.info("profile %s from %s replaces the shipped %s", p.id, taken[p.id].path, p.path)
        else:
            shipped.append(p)
    return [*site, *shipped]


def is_profile_path(text: str) -> bool:
    """True when a source's `profile` names a file rather than a profile id."""
    return text.endswith(".toml") or "/" in text


def usable_profiles(profile: str, profile_dir: Path | None) -> list[Profile]:
    """Every profile a source configured so could use; ProfileError naming file and key.

    A `profile` path gives that one file; otherwise the site's and the shipped
    profiles, and a `profile` id must be one of them.
    """
    if is_profile_path(profile):
        return [load_profile_file(Path(profile))]
    profiles = load_profiles(profile_dir)
    if profile and all(p.id != profile for p in profiles):
        known = ", ".join(sorted(p.id for p in profiles))
        raise ProfileError(f"no profile {profile!r} (known: {known})")
    return profiles


def candidate_profiles(
    profiles: list[Profile], sys_object_id: tuple[int, ...], override: str = ""
) -> list[Profile]:
    """The profiles to try on a device, best first: the override (by id) alone if given,
    else every profile whose prefix matches, longest prefix first, then the fallbacks.

    Between prefixes of one length the earlier profile wins: load_profiles puts the
    site's first.
    """
    if override:
        return [p for p in profiles if p.id == override][:1]
    matching = [p for p in profiles if p.matches(sys_object_id)]
    matching.sort(key=lambda p: -p.matches(sys_object_id))  # stable: site profiles first
    return matching + [p for p in profiles if p.fallback and p not in matching]


def select_profile(
    profiles: list[Profile], sys_object_id: tuple[int, ...], override: str = ""
) -> Profile | None:
    """The first of candidate_profiles, or None when no profile could serve the device."""
    candidates = candidate_profiles(profiles, sys_object_id, override)
    return candidates[0] if candidates else None


# What rackguard's policies take as rack evidence. A source whose profile reads none of
# these from its device gives no evidence at all and is reported degraded.
EVIDENCE_KINDS = frozenset(
    {
        SensorKind.INLET_TEMPERATURE,
        SensorKind.AIR_TEMPERATURE,
        SensorKind.HUMIDITY,
        SensorKind.POWER,
        SensorKind.COOLANT_SUPPLY_TEMPERATURE,
        SensorKind.COOLANT_RETURN_TEMPERATURE,
        SensorKind.COOLANT_FLOW,
    }
)


def is_evidence(kind: SensorKind, unit: str) -> bool:
    """True for a kind the policies use, in the unit they use it in (not VA for power)."""
    return kind in EVIDENCE_KINDS and DEFAULT_UNITS.get(kind) == unit


def evidence_kinds(profile: Profile) -> list[str]:
    """The evidence kinds a profile looks for, sorted by name."""
    specs = [*profile.scalars, *(s for t in profile.tables for s in t.sensors)]
    return sorted({s.kind.value for s in specs if not s.skip and is_evidence(s.kind, s.unit)})
