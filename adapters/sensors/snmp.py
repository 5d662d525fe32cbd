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
import dataclasses
import logging
import re
import time
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adapters.errors import SourceBadData, SourceError, SourceSetupError, SourceUnavailable
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
    StatusSpec,
    TableSpec,
    candidate_profiles,
    class_word,
    evidence_kinds,
    is_evidence,
    is_profile_path,
    oid_tuple,
    render,
    usable_profiles,
)
from adapters.sensors.snmp_scaling import Conversion, Missing, conversion
from policies.model import Quality, Reading, SensorKind

log = logging.getLogger(__name__)

SYS_DESCR: OidTuple = (1, 3, 6, 1, 2, 1, 1, 1, 0)
SYS_OBJECT_ID: OidTuple = (1, 3, 6, 1, 2, 1, 1, 2, 0)
_TOO_BIG_VALUE = Missing("tooBig: the agent cannot return this value")
_MAX_ROWS = 5000  # a walk that never ends (a broken agent) stops here
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")  # "/" would clash with Reading.key
# What an agent answers for an OID it does not implement (RFC 3416).
_NOT_ON_DEVICE = frozenset({"noSuchObject", "noSuchInstance", "endOfMibView"})


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
    status: StatusSpec | None = None
    status_oid: OidTuple | None = None
    absent: str = ""  # why the device lacks this OID (found at connect); "" when polled

    @property
    def oids(self) -> list[OidTuple]:
        """What a poll GETs for this point: the value, then its status column if any."""
        return [self.oid] if self.status_oid is None else [self.oid, self.status_oid]


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
        self._logged_profile = ""
        self._logged_absent: frozenset[str] = frozenset()
        self._logged_missing: tuple[str, ...] | None = None
        self._candidates: list[Profile] = []
        self._skipped: list[str] = []
        self.trials: list[ProfileTrial] = []  # what each candidate profile found at connect
        self.notes: list[str] = []  # what an operator should know after connect (for probe)
        # Why the last read gave no evidence rackguard uses ("" when it did): the runner
        # reports such a source as degraded, `probe` exits 2.
        self.degraded_reason = ""
        self.missing: list[str] = []  # evidence kinds the profile looks for but did not read

    # --- connect ----------------------------------------------------------------------

    async def _reopen(self) -> None:
        """A fresh SNMP session (closing one still open)."""
        if self._connected:
            await self.close()
        try:
            await self._client.open()
        except SourceSetupError as err:
            raise SourceSetupError(f"{self.name}: {err}") from err

    async def connect(self) -> None:
        """Open, identify the device, pick its profile and discover its table rows."""
        await self._reopen()
        try:
            try:
                await self._identify()
            except SourceUnavailable as err:
                if "no answer within" not in str(err):
                    raise
                # The first request timed out: say what that can mean, for this version.
                why = await self._client.why_silent()
                raise SourceUnavailable(f"{self.name}: {err}; {why}") from err
            except SourceError as err:
                if str(err).startswith(f"{self.name}: "):
                    raise
                raise type(err)(f"{self.name}: {err}") from err
            profile = await self._try_candidates()
            self._rebatch()
            self._connected = True
        except BaseException:
            await self._client.close()
            raise
        self._log_connect(profile)

    async def _try_candidates(self) -> Profile:
        """Discover with each candidate profile until one finds evidence on the device.

        A sysObjectID prefix can be shared by product lines whose tables differ: the
        longest match is tried first; when it finds nothing rackguard uses, the next
        (and at last the fallback) is tried, and the trials are kept for `probe`.
        """
        self.trials = []
        found: list[tuple[Profile, list[_Point], list[str]]] = []
        for profile in self._candidates:
            points, skipped = await self._discover_profile(profile)
            trial = ProfileTrial.of(profile, points, skipped)
            self.trials.append(trial)
            found.append((profile, points, skipped))
            if trial.evidence:
                break
        polled = [f for f in found if any(not p.absent for p in f[1])]
        with_evidence = [f for f in polled if any(_is_evidence(p) for p in f[1] if not p.absent)]
        # A profile that claims the device serves it even when it found nothing: the source
        # runs degraded and says why (see read), where refusing to connect would stop the
        # daemon at start. Only the fallback finding nothing means no profile fits.
        # Without evidence anywhere, the degraded source is reported against the profile
        # that claims the device (not the generic fallback), preferring one that polls.
        claimed = [f for f in found if not f[0].fallback or self._opt.profile]
        ranked = with_evidence or [f for f in claimed if f in polled] or claimed or polled
        if not ranked:
            tried = "; ".join(t.summary() for t in self.trials)
            raise SourceSetupError(
                f"{self.name}: no profile matches sysObjectID {self.sys_object_id or '(none)'}"
                f" ({self.sys_descr[:60]!r}) and the fallback found no sensors ({tried});"
                " run `rackguard probe --all-profiles`, set `profile` in the source's config"
                " or write one (docs/pdu-profiles.md)"
            )
        self.profile, self._points, self._skipped = ranked[0]
        self._max_varbinds = min(self._opt.max_varbinds, self.profile.max_varbinds or 10_000)
        return self.profile

    async def _discover_profile(self, profile: Profile) -> tuple[list[_Point], list[str]]:
        """The points one profile finds on the device, and the rows it skips by name."""
        self.profile = profile
        self._skipped = []
        self._max_varbinds = min(self._opt.max_varbinds, profile.max_varbinds or 10_000)
        points = [self._scalar_point(spec) for spec in profile.scalars if not spec.skip]
        self._skipped = [f"{spec.id} ({spec.skip})" for spec in profile.scalars if spec.skip]
        for table in profile.tables:
            points.extend(await self._discover(table))
        if not points:
            return [], self._skipped
        return await self._mark_absent(_unique_ids(points)), self._skipped

    def _log_connect(self, profile: Profile) -> None:
        """Which profile serves this device, and which sensors it lacks: once, and on change."""
        origin = "site profile" if profile.site else "shipped profile"
        verified = profile.verified_with or "nothing: written from the MIB, not yet verified"
        served = (
            f"{self.name}: {origin} {profile.id} ({profile.path}) serves"
            f" sysObjectID {self.sys_object_id or '(none)'} ({self.sys_descr[:60]!r});"
            f" verified with {verified}"
        )
        order = [t.profile for t in self.trials]
        passed = [p.id for p in order[: order.index(profile)]] if profile in order else []
        if passed:  # a longer match read nothing here: worth a line in the log
            served += f" (tried first, found nothing rackguard uses: {', '.join(passed)})"
        if served != self._logged_profile:
            log.info("%s; %d sensors", served, len(self._points))
            self._logged_profile = served
        absent = frozenset(p.sensor for p in self._points if p.absent)
        self.notes = [served]
        if absent:
            self.notes.append(
                f"{len(absent)} sensor(s) of the profile are not on this device and are not"
                f" polled: {', '.join(sorted(absent))}"
            )
        if absent != self._logged_absent:
            if absent:
                log.info("%s: %s", self.name, self.notes[-1])
            self._logged_absent = absent
        if self._skipped:
            self.notes.append(f"skipped by the profile: {'; '.join(self._skipped)}")
        for trial in self.trials:
            if trial.profile is not profile:
                self.notes.append(f"also tried {trial.summary()}")

    def _load_profiles(self) -> list[Profile]:
        if self._profiles is None:
            try:
                self._profiles = usable_profiles(self._opt.profile, self._opt.profile_dir)
            except ProfileError as err:
                raise SourceSetupError(f"{self.name}: {err}") from err
        return self._profiles

    async def _read_identity(self) -> None:
        request = self._client.prepare_get([SYS_OBJECT_ID, SYS_DESCR])
        oid_value, descr = await self._client.get(request)
        self.sys_descr = text(descr)
        self.sys_object_id = oid_text(oid_value)

    async def _identify(self) -> None:
        await self._read_identity()
        profiles = self._load_profiles()
        wanted = self._opt.profile
        if is_profile_path(wanted):
            self.profile = profiles[0]
            self._candidates = [profiles[0]]
            return
        try:
            sys_oid = oid_tuple(self.sys_object_id)
        except ValueError:
            sys_oid = ()
        self._candidates = candidate_profiles(profiles, sys_oid, wanted)
        profile = self._candidates[0] if self._candidates else None
        if profile is None:
            known = ", ".join(sorted(p.id for p in profiles))
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
        if probe is not None:
            # The device's own name ("A1") or the row index ("1.1"), whichever is configured.
            positions = self._opt.probe_positions
            position = positions.get(probe) or positions.get(values.get("index", ""))
            if position:
                labels["probe"] = position
        id_values = {k: _safe(v) for k, v in {**values, **labels}.items()}
        status_oid = None
        if spec.status is not None:
            status_oid = oid_tuple(spec.status.column) + (oid[len(oid_tuple(spec.value)) :])
        return _Point(
            oid=oid,
            sensor=render(spec.id, id_values),
            kind=spec.kind,
            unit=spec.unit,
            labels=types.MappingProxyType(labels),
            conv=conversion(spec, fields),
            status=spec.status,
            status_oid=status_oid,
        )

    async def _mark_absent(self, points: list[_Point]) -> list[_Point]:
        """Points whose OID the device does not implement, found by one GET at connect.

        A Sentry3 without infeedPower answers noSuchInstance on every poll: such a
        column is absent (reported as ABSENT, not polled), not a fault each time.
        """
        values = iter(await self._get_raw([o for p in points for o in p.oids]))
        out = []
        for point in points:
            got = decode(next(values))
            state = decode(next(values)) if point.status_oid is not None else None
            if isinstance(got, Missing) and got.reason in _NOT_ON_DEVICE:
                reason = f"not on this device ({got.reason} at connect)"
                out.append(dataclasses.replace(point, absent=reason))
            elif isinstance(state, Missing) and state.reason in _NOT_ON_DEVICE:
                # An older firmware without the status column: the value alone decides.
                out.append(dataclasses.replace(point, status=None, status_oid=None))
            else:
                out.append(point)
        return out

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
                if spec.skip:
                    safe = {k: _safe(v) for k, v in values.items()}
                    self._skipped.append(f"{render(spec.id, safe)} ({spec.skip})")
                    continue
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
        return [text(v) for v in await self._get_raw(oids)]

    async def _get_raw(self, oids: Sequence[OidTuple]) -> list[Any]:
        out: list[Any] = []
        size = self._max_varbinds
        for i in range(0, len(oids), size):
            chunk = oids[i : i + size]
            out.extend(await self._get_split(self._client.prepare_get(chunk)))
        return out

    # --- poll -------------------------------------------------------------------------

    def _rebatch(self) -> None:
        """Polled points in requests of at most max_varbinds OIDs (a status column counts)."""
        size = self._max_varbinds
        self._batches = []
        chunk: list[_Point] = []
        count = 0
        for point in (p for p in self._points if not p.absent):
            n = len(point.oids)
            if chunk and count + n > size:
                self._batches.append(self._prepared(chunk))
                chunk, count = [], 0
            chunk.append(point)
            count += n
        if chunk:
            self._batches.append(self._prepared(chunk))

    def _prepared(self, chunk: list[_Point]) -> tuple[list[_Point], Prepared]:
        return chunk, self._client.prepare_get([o for p in chunk for o in p.oids])

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
        """One poll of every sensor, within poll_deadline_s; judges what it gave (see
        degraded_reason and missing)."""
        out = await self._poll()
        self._judge_coverage(out)
        return out

    async def survey(self) -> list[tuple[ProfileTrial, list[Reading]]]:
        """Every profile this source could use, each tried on the device and read once.

        For `probe --all-profiles`: which profile reads what, whatever the sysObjectID.
        Leaves the adapter closed.
        """
        await self._reopen()
        out = []
        try:
            await self._read_identity()
            for profile in self._load_profiles():
                points, skipped = await self._discover_profile(profile)
                self._points = points
                self._rebatch()
                self._connected = True
                out.append((ProfileTrial.of(profile, points, skipped), list(await self._poll())))
        finally:
            await self.close()
        return out

    async def _poll(self) -> list[Reading]:
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
            for p in self._points:
                if p.absent:
                    out.append(
                        Reading(
                            self.name, p.sensor, p.kind, None, p.unit, Quality.ABSENT,
                            mono, wall, reason=p.absent, labels=p.labels,
                        )
                    )  # fmt: skip
        except TimeoutError as err:
            raise SourceUnavailable(
                f"{self.name}: poll did not finish within {self._opt.poll_deadline_s:g}s"
                f" ({self._client.target})"
            ) from err
        if self._max_varbinds != size:
            self._rebatch()
        return out

    def _judge_coverage(self, readings: Sequence[Reading]) -> None:
        """Set degraded_reason and missing from one poll; log a change of either, once."""
        assert self.profile is not None
        wanted = evidence_kinds(self.profile)
        good = {r.kind.value for r in readings if r.quality is Quality.GOOD and _good_evidence(r)}
        self.missing = [k for k in wanted if k not in good]
        why = {k: _why_not(k, readings) for k in self.missing}
        if good:
            self.degraded_reason = ""
        else:
            looked = ", ".join(wanted) or "no kind rackguard uses"
            found = "; ".join(f"{k}: {w}" for k, w in why.items()) or "nothing"
            self.degraded_reason = (
                f"profile {self.profile.id} ({self.profile.path}) reads nothing rackguard uses"
                f" from this device (sysObjectID {self.sys_object_id or '(none)'}): looked for"
                f" {looked}; found {found}"
            )
        key = (self.degraded_reason, *self.missing)
        if key != self._logged_missing:
            # INFO: the runner reports a degraded source at ERROR, `probe` on stderr.
            if self.degraded_reason:
                log.info("%s: %s", self.name, self.degraded_reason)
            elif self.missing:
                log.info(
                    "%s: profile %s reads %s but not %s",
                    self.name,
                    self.profile.id,
                    ", ".join(sorted(good)),
                    "; ".join(f"{k} ({w})" for k, w in why.items()),
                )
            elif self._logged_missing is not None:
                log.info(
                    "%s: profile %s now reads every kind it looks for", self.name, self.profile.id
                )
            self._logged_missing = key

    def _emit(
        self,
        out: list[Reading],
        points: list[_Point],
        values: list[Any],
        mono: float,
        wall: float,
    ) -> None:
        wanted = sum(len(p.oids) for p in points)
        if len(values) != wanted:
            raise SourceBadData(
                f"{self.name}: agent answered {len(values)} values for {wanted} OIDs"
            )
        source = self.name
        k = 0
        for point in points:
            raw = values[k]
            k += 1
            conv = point.conv
            value = decode(raw)
            result = conv.apply(value) if isinstance(conv, Conversion) else conv
            if point.status is not None:
                state = decode(values[k])
                k += 1
                # The device's own word on the row outranks what its value looks like
                # (out of range), but not the MIB's documented "no value" sentinel.
                if not (isinstance(conv, Conversion) and conv.is_sentinel(value)):
                    result = _status_problem(point.status, state) or result
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


def _status_problem(status: StatusSpec, state: object) -> str:
    """Why the status column makes the value unusable; "" when its state is a good one."""
    if isinstance(state, Missing):
        return f"status column unreadable: {state.reason}"
    if not isinstance(state, int):
        return "status column is not an integer"
    return "" if state in status.good else status.reason(state)


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
            out.append(dataclasses.replace(p, sensor=f"{p.sensor}@{suffix}"))
        else:
            out.append(p)
    return out


def _is_evidence(point: _Point) -> bool:
    return is_evidence(point.kind, point.unit)


def _good_evidence(reading: Reading) -> bool:
    return is_evidence(reading.kind, reading.unit)


def _why_not(kind: str, readings: Sequence[Reading]) -> str:
    """Why a poll has no GOOD reading of a kind: each distinct reason once, with a count."""
    reasons: dict[str, int] = {}
    for r in readings:
        if r.kind.value == kind and _good_evidence(r):
            reasons[r.reason or r.quality.value] = reasons.get(r.reason or r.quality.value, 0) + 1
    if not reasons:
        return "no row on this device"
    return ", ".join(f"{n}x {why}" if n > 1 else why for why, n in sorted(reasons.items()))


@dataclass(frozen=True, slots=True)
class ProfileTrial:
    """What one candidate profile found on a device at connect."""

    profile: Profile
    found: int  # sensors found in its tables and scalars
    polled: int  # of those, the ones the device implements
    evidence: tuple[str, ...]  # evidence kinds among the polled
    skipped: int

    @classmethod
    def of(cls, profile: Profile, points: list[_Point], skipped: list[str]) -> ProfileTrial:
        polled = [p for p in points if not p.absent]
        evidence = sorted({p.kind.value for p in polled if _is_evidence(p)})
        return cls(profile, len(points), len(polled), tuple(evidence), len(skipped))

    def summary(self) -> str:
        """One line: the profile, what it looked for, what it found."""
        looked = ", ".join(evidence_kinds(self.profile)) or "no kind rackguard uses"
        if not self.found:
            got = "found no rows"
        else:
            got = f"found {self.polled} sensor(s) on the device"
            if self.polled < self.found:
                got += f" ({self.found - self.polled} more not on it)"
            got += f", evidence: {', '.join(self.evidence) or 'none'}"
        return f"profile {self.profile.id} (looked for {looked}): {got}"
