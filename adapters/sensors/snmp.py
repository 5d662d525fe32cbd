"""SNMP adapter for rack PDUs and cooling units, driven by a vendor profile (TOML data).

connect() reads sysObjectID, picks the profile (config override, else the longest
matching prefix), walks each profile table once with small GETBULKs and reads the
row fields (names, units, decimal digits). From then on a poll is a few GETs of
known OIDs, at most ``max_varbinds`` per request, sent one after another so a weak
agent never sees a burst, all under one deadline. A tooBig answer splits the request
and lowers the batch size for later polls. Values that cannot be trusted (SNMP
exceptions, wrong types, sentinels, out of range) become BAD readings with the reason.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adapters.errors import SourceBadData, SourceSetupError, SourceUnavailable
from adapters.sensors.snmp_client import (
    OidTuple,
    Prepared,
    SnmpClient,
    TooBig,
    decode,
    oid_text,
    text,
)
from adapters.sensors.snmp_profiles import (
    Profile,
    ProfileError,
    SensorSpec,
    TableSpec,
    class_word,
    load_profile_file,
    load_profiles,
    oid_tuple,
    render,
    select_profile,
)
from adapters.sensors.snmp_scaling import Conversion, Missing, conversion
from policies.model import Quality, Reading, SensorKind

log = logging.getLogger(__name__)

SYS_DESCR: OidTuple = (1, 3, 6, 1, 2, 1, 1, 1, 0)
SYS_OBJECT_ID: OidTuple = (1, 3, 6, 1, 2, 1, 1, 2, 0)
_TOO_BIG_VALUE = Missing("tooBig: the agent cannot return this value")
_MAX_ROWS = 5000  # a walk that never ends (a broken agent) stops here
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")  # "/" would clash with Reading.key


@dataclass(frozen=True, slots=True)
class SnmpOptions:
    """Tuning and identity that do not depend on the SNMP version."""

    max_varbinds: int = 16
    max_repetitions: int = 10
    poll_deadline_s: float = 4.0
    profile: str = ""  # a profile id or a path to a .toml file; "" matches by sysObjectID
    profile_dir: Path | None = None
    probe_positions: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Point:
    """One polled OID and how it becomes a Reading."""

    oid: OidTuple
    sensor: str
    kind: SensorKind
    unit: str
    labels: Mapping[str, str]
    conv: Conversion | str  # a str: the scale could not be read, every reading is BAD


def _safe(value: str) -> str:
    """A field value made fit for a sensor id: spaces and odd characters become '_'."""
    return _UNSAFE.sub("_", value.strip()).strip("_") or "_"


class SnmpAdapter:
    """SensorAdapter for one PDU or cooling unit over SNMP (see the module docstring)."""

    def __init__(self, name: str, client: SnmpClient, options: SnmpOptions | None = None) -> None:
        self.name = name
        self._client = client
        self._opt = options or SnmpOptions()
        self._profiles: list[Profile] | None = None
        self.profile: Profile | None = None
        self.sys_object_id: str = ""
        self.sys_descr: str = ""
        self._points: list[_Point] = []
        self._batches: list[tuple[list[_Point], Prepared]] = []
        self._max_varbinds = self._opt.max_varbinds
        self._connected = False

    # --- connect ----------------------------------------------------------------------

    async def connect(self) -> None:
        """Open, identify the device, pick its profile and discover its table rows."""
        if self._connected:
            await self.close()
        await self._client.open()
        try:
            await self._identify()
            profile = self.profile
            assert profile is not None
            self._max_varbinds = min(self._opt.max_varbinds, profile.max_varbinds or 10_000)
            points = [self._scalar_point(spec) for spec in profile.scalars]
            for table in profile.tables:
                points.extend(await self._discover(table))
            if not points:
                raise SourceSetupError(
                    f"{self.name}: profile {profile.id!r} found no sensors on this device"
                    f" (sysObjectID {self.sys_object_id or '(none)'}, {self.sys_descr[:60]!r});"
                    " set `profile` in the source's config or write one (docs/pdu-profiles.md)"
                )
            self._points = _unique_ids(points)
            self._rebatch()
            self._connected = True
        except BaseException:
            await self._client.close()
            raise
        log.debug(
            "%s: %s matched profile %s; %d sensors in %d requests",
            self.name,
            self.sys_object_id or "(no sysObjectID)",
            profile.id,
            len(self._points),
            len(self._batches),
        )

    def _load_profiles(self) -> list[Profile]:
        if self._profiles is None:
            try:
                self._profiles = load_profiles(self._opt.profile_dir)
            except ProfileError as err:
                raise SourceSetupError(f"{self.name}: {err}") from err
        return self._profiles

    async def _identify(self) -> None:
        request = self._client.prepare_get([SYS_OBJECT_ID, SYS_DESCR])
        oid_value, descr = await self._client.get(request)
        self.sys_descr = text(descr)
        self.sys_object_id = oid_text(oid_value)
        wanted = self._opt.profile
        if wanted.endswith(".toml") or "/" in wanted:
            try:
                self.profile = load_profile_file(Path(wanted))
            except ProfileError as err:
                raise SourceSetupError(f"{self.name}: {err}") from err
            return
        profiles = self._load_profiles()
        try:
            sys_oid = oid_tuple(self.sys_object_id)
        except ValueError:
            sys_oid = ()
        profile = select_profile(profiles, sys_oid, wanted)
        if profile is None:
            known = ", ".join(sorted(p.id for p in profiles))
            if wanted:
                raise SourceSetupError(f"{self.name}: no profile {wanted!r} (known: {known})")
            raise SourceSetupError(
                f"{self.name}: no profile matches sysObjectID {self.sys_object_id or '(none)'}"
                f" ({self.sys_descr[:60]!r}); set `profile` in the source's config or add one"
                f" to profile_dir (known: {known})"
            )
        self.profile = profile

    def _scalar_point(self, spec: SensorSpec) -> _Point:
        values = {"class": class_word(spec.kind)}
        return self._point(spec, oid_tuple(spec.value), values, {})

    def _point(
        self,
        spec: SensorSpec,
        oid: OidTuple,
        values: dict[str, str],
        fields: Mapping[str, str],
    ) -> _Point:
        assert self.profile is not None
        labels = {"device": self.profile.id, "oid": ".".join(map(str, oid))}
        for key, tmpl in spec.labels.items():
            labels[key] = render(tmpl, values).strip()
        probe = labels.get("probe")
        if probe is not None and probe in self._opt.probe_positions:
            labels["probe"] = self._opt.probe_positions[probe]
        id_values = {k: _safe(v) for k, v in {**values, **labels}.items()}
        return _Point(
            oid=oid,
            sensor=render(spec.id, id_values),
            kind=spec.kind,
            unit=spec.unit,
            labels=types.MappingProxyType(labels),
            conv=conversion(spec, fields),
        )

    async def _discover(self, table: TableSpec) -> list[_Point]:
        walk = oid_tuple(table.walk)
        rows = await self._walk(walk)
        constants: dict[str, str] = {}
        if table.constants:
            names = list(table.constants)
            got = await self._get_texts([oid_tuple(table.constants[n]) for n in names])
            constants = dict(zip(names, got, strict=True))
        fields_by_row: dict[OidTuple, dict[str, str]] = {
            index: {name: value for name, col in table.fields.items() if oid_tuple(col) == walk}
            for index, value in rows
        }
        # Fields that need a GET per row (the walked column is already known).
        others = [(n, oid_tuple(c)) for n, c in table.fields.items() if oid_tuple(c) != walk]
        candidates = [index for index, _ in rows]
        # Filter early on what the walk already gave, to GET fields only for kept rows.
        candidates = [
            i for i in candidates if _matches(table.where, fields_by_row[i], partial=True)
        ]
        if others and candidates:
            wanted = [col + index for index in candidates for _, col in others]
            got = await self._get_texts(wanted)
            k = 0
            for index in candidates:
                for name, _ in others:
                    fields_by_row[index][name] = got[k]
                    k += 1
        points: list[_Point] = []
        for index in candidates:
            fields = fields_by_row[index]
            if not _matches(table.where, fields, partial=False):
                continue
            base = {
                **constants,
                **fields,
                "index": ".".join(map(str, index)),
                **{f"index{i + 1}": str(part) for i, part in enumerate(index)},
            }
            claimed: set[str] = set()
            for spec in table.sensors:
                if spec.value in claimed or not _matches(spec.match, base, partial=False):
                    continue
                claimed.add(spec.value)
                values = {**base, "class": class_word(spec.kind)}
                points.append(self._point(spec, oid_tuple(spec.value) + index, values, base))
        return points

    async def _walk(self, column: OidTuple) -> list[tuple[OidTuple, str]]:
        """Every (index, text value) under a column, by GETBULK with small repetitions."""
        assert self.profile is not None
        reps = self.profile.max_repetitions or self._opt.max_repetitions
        rows: list[tuple[OidTuple, str]] = []
        start = column
        n = len(column)
        while len(rows) < _MAX_ROWS:
            try:
                got = await self._client.bulk(start, reps)
            except TooBig:
                if reps == 1:
                    raise SourceBadData(f"{self.name}: tooBig for a single row of a walk") from None
                reps = max(1, reps // 2)
                continue
            if not got:
                break
            for oid, value in got:
                if oid[:n] != column or isinstance(decode(value), Missing):
                    return rows
                if oid <= start:
                    raise SourceBadData(
                        f"{self.name}: agent returned a non-increasing OID in a walk"
                        f" ({'.'.join(map(str, oid))} after {'.'.join(map(str, start))})"
                    )
                rows.append((oid[n:], text(value)))
                start = oid
        return rows

    async def _get_texts(self, oids: Sequence[OidTuple]) -> list[str]:
        out: list[str] = []
        size = self._max_varbinds
        for i in range(0, len(oids), size):
            chunk = oids[i : i + size]
            out.extend(text(v) for v in await self._get_split(self._client.prepare_get(chunk)))
        return out

    # --- poll -------------------------------------------------------------------------

    def _rebatch(self) -> None:
        size = self._max_varbinds
        self._batches = []
        for i in range(0, len(self._points), size):
            chunk = self._points[i : i + size]
            self._batches.append((chunk, self._client.prepare_get([p.oid for p in chunk])))

    async def _get_split(self, request: Prepared) -> list[Any]:
        """GET, halving the request on tooBig; a single OID that is tooBig is Missing."""
        try:
            return await self._client.get(request)
        except TooBig:
            if len(request.oids) == 1:
                return [_TOO_BIG_VALUE]
        half = len(request.oids) // 2
        if half < self._max_varbinds:
            log.warning(
                "%s: agent answered tooBig; now at most %d OIDs per request", self.name, half
            )
            self._max_varbinds = half
        first = await self._get_split(self._client.prepare_get(request.oids[:half]))
        second = await self._get_split(self._client.prepare_get(request.oids[half:]))
        return first + second

    async def read(self) -> Sequence[Reading]:
        """One poll of every sensor, within poll_deadline_s."""
        if not self._connected:
            raise SourceUnavailable(f"{self.name}: not connected; call connect() first")
        mono, wall = time.monotonic(), time.time()
        out: list[Reading] = []
        size = self._max_varbinds
        try:
            async with asyncio.timeout(self._opt.poll_deadline_s):
                for points, request in self._batches:
                    values = await self._get_split(request)
                    self._emit(out, points, values, mono, wall)
        except TimeoutError as err:
            raise SourceUnavailable(
                f"{self.name}: poll did not finish within {self._opt.poll_deadline_s:g}s"
                f" ({self._client.target})"
            ) from err
        if self._max_varbinds != size:
            self._rebatch()
        return out

    def _emit(
        self,
        out: list[Reading],
        points: list[_Point],
        values: list[Any],
        mono: float,
        wall: float,
    ) -> None:
        if len(values) != len(points):
            raise SourceBadData(
                f"{self.name}: agent answered {len(values)} values for {len(points)} OIDs"
            )
        source = self.name
        for point, raw in zip(points, values, strict=True):
            conv = point.conv
            result = conv.apply(decode(raw)) if isinstance(conv, Conversion) else conv
            if isinstance(result, float):
                out.append(
                    Reading(
                        source, point.sensor, point.kind, result, point.unit,
                        Quality.GOOD, mono, wall, labels=point.labels,
                    )
                )  # fmt: skip
            else:
                out.append(
                    Reading(
                        source, point.sensor, point.kind, None, point.unit,
                        Quality.BAD, mono, wall, reason=result, labels=point.labels,
                    )
                )  # fmt: skip

    async def close(self) -> None:
        """Close the SNMP session; never raises."""
        self._connected = False
        try:
            await self._client.close()
        except Exception as err:  # close never raises
            log.debug("%s: error while closing: %s", self.name, err)

    @property
    def sensors(self) -> list[str]:
        """The sensor ids a poll reports, in order (after connect)."""
        return [p.sensor for p in self._points]


def _matches(
    patterns: Mapping[str, re.Pattern[str]], fields: Mapping[str, str], *, partial: bool
) -> bool:
    """True when every pattern finds a match; with partial, fields not yet read pass."""
    for name, pattern in patterns.items():
        value = fields.get(name)
        if value is None:
            if partial:
                continue
            return False
        if not pattern.search(value):
            return False
    return True


def _unique_ids(points: list[_Point]) -> list[_Point]:
    """Sensor ids made unique: a repeated id gets its OID's last parts appended."""
    counts: dict[str, int] = {}
    for p in points:
        counts[p.sensor] = counts.get(p.sensor, 0) + 1
    out = []
    for p in points:
        if counts[p.sensor] > 1:
            suffix = ".".join(map(str, p.oid[-2:]))
            out.append(_Point(p.oid, f"{p.sensor}@{suffix}", p.kind, p.unit, p.labels, p.conv))
        else:
            out.append(p)
    return out
