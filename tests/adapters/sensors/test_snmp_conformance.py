"""Recordings of real PDUs and cooling units, served by snmpsim over UDP, read through the adapter.

For every device in ../shared/data/snmp the adapter must pick the profile by the
recording's sysObjectID and report every sensor of expected_sensors.csv within 0.01
absolute or 0.1 % of expected_value (= raw / divisor x multiplier).
"""

from __future__ import annotations

import asyncio
import csv
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from adapters.sensors.snmp import SnmpAdapter
from adapters.sensors.snmp_client import V2cClient
from fakes.snmp_recording import SnmpsimServer
from policies.model import Quality, Reading, SensorKind
from tests.support.paths import SHARED_DATA

DATA = SHARED_DATA / "snmp"
EXPECTED = DATA / "expected_sensors.csv"
ABSENT = f"{DATA} is absent: the recordings of real devices live outside the repository"

# sensor_class in the CSV -> the kinds a reading of it may have.
CLASS_KINDS: dict[str, set[SensorKind]] = {
    "temperature": {
        SensorKind.TEMPERATURE,
        SensorKind.INLET_TEMPERATURE,
        SensorKind.AIR_TEMPERATURE,
        SensorKind.COOLANT_SUPPLY_TEMPERATURE,
        SensorKind.COOLANT_RETURN_TEMPERATURE,
    },
    "humidity": {SensorKind.HUMIDITY},
    "power": {SensorKind.POWER},
    "current": {SensorKind.CURRENT},
    "waterflow": {SensorKind.COOLANT_FLOW},
    "airflow": {SensorKind.AIRFLOW},
    "pressure": {SensorKind.PRESSURE, SensorKind.COOLANT_PRESSURE},
}


def _expected() -> dict[str, list[dict[str, str]]]:
    rows: dict[str, list[dict[str, str]]] = defaultdict(list)
    if EXPECTED.is_file():
        with EXPECTED.open(newline="") as fh:
            for row in csv.DictReader(fh):
                rows[row["device"]].append(row)
    return rows


ROWS = _expected()
DEVICES: list[Any] = sorted(ROWS) or [pytest.param("none", marks=pytest.mark.skip(reason=ABSENT))]


@pytest.fixture(scope="module")
def snmpsim() -> Iterator[SnmpsimServer]:
    """One snmpsim serving every recording (community = file stem)."""
    if not EXPECTED.is_file():
        pytest.skip(ABSENT)
    server = SnmpsimServer(sorted(DATA.glob("*.snmprec")))
    server.start()
    yield server
    server.stop()


def _adapter(server: SnmpsimServer, device: str) -> SnmpAdapter:
    client = V2cClient("127.0.0.1", server.port, device.encode(), timeout_s=2.0, retries=1)
    return SnmpAdapter(f"pdu-{device}", client)


@pytest.mark.parametrize("device", DEVICES)
async def test_recording_reports_every_expected_sensor(snmpsim: SnmpsimServer, device: str) -> None:
    adapter = _adapter(snmpsim, device)
    try:
        await adapter.connect()
        readings = await adapter.read()
    finally:
        await adapter.close()
    assert adapter.profile is not None and not adapter.profile.fallback, adapter.sys_object_id
    by_oid = {r.labels["oid"]: r for r in readings}
    assert len(by_oid) == len(readings), "two readings share an OID"
    assert len({r.sensor for r in readings}) == len(readings), "sensor ids must be unique"
    for row in ROWS[device]:
        oid = row["oid"].lstrip(".")
        got = by_oid.get(oid)
        where = f"{device} {oid} ({row['description']})"
        assert got is not None, f"{where}: not reported"
        assert got.quality is Quality.GOOD, f"{where}: {got.reason}"
        assert got.value is not None
        expected = float(row["expected_value"])
        assert abs(got.value - expected) <= max(0.01, abs(expected) * 0.001), (
            f"{where}: {got.value} != {expected}"
        )
        assert got.kind in CLASS_KINDS[row["sensor_class"]], f"{where}: kind {got.kind}"
        assert got.labels["device"] == adapter.profile.id
        assert got.source == f"pdu-{device}"


async def test_rittal_water_and_air_temperatures_get_their_kinds(snmpsim: SnmpsimServer) -> None:
    adapter = _adapter(snmpsim, "rittal-lcp_cmciii-pu-lcp")
    try:
        await adapter.connect()
        readings = {r.labels["oid"]: r for r in await adapter.read()}
    finally:
        await adapter.close()
    base = "1.3.6.1.4.1.2606.7.4.2.2.1.11"
    assert readings[f"{base}.2.135"].kind is SensorKind.COOLANT_SUPPLY_TEMPERATURE
    assert readings[f"{base}.2.144"].kind is SensorKind.COOLANT_RETURN_TEMPERATURE
    assert readings[f"{base}.2.17"].kind is SensorKind.AIR_TEMPERATURE
    assert readings[f"{base}.2.153"].unit == "liters_per_minute"


async def test_sentinel_probe_slots_are_bad_with_the_reason(snmpsim: SnmpsimServer) -> None:
    adapter = _adapter(snmpsim, "sentry4_switched8i")
    try:
        await adapter.connect()
        readings = {r.sensor: r for r in await adapter.read()}
    finally:
        await adapter.close()
    absent = readings["inlet.A1.temperature"]
    assert absent.quality is Quality.BAD
    assert absent.reason == "no probe fitted (sentinel -410)"
    fitted = readings["inlet.E1.temperature"]
    assert fitted.kind is SensorKind.INLET_TEMPERATURE and fitted.labels["probe"] == "E1"


async def test_garbage_values_are_bad_readings_not_exceptions() -> None:
    if not EXPECTED.is_file():
        pytest.skip(ABSENT)
    server = SnmpsimServer([DATA / "raritan-pdu_px2-temp.snmprec"], garbage=True)
    await asyncio.to_thread(server.start)
    adapter = _adapter(server, "raritan-pdu_px2-temp")
    try:
        await adapter.connect()
        readings = await adapter.read()
    finally:
        await adapter.close()
        await asyncio.to_thread(server.stop)
    assert readings, "the profile still finds its rows"
    assert all(r.quality is Quality.BAD for r in readings)
    # The decimal-digits column is junk too, so the scale is unusable.
    reasons = {r.reason for r in readings}
    assert all(r.startswith(("not a number", "scale field")) for r in reasons), reasons


# "No value" as MIBs spell it (-1, -10, -410, -9999, 0xFFFF, 0x7FFFFFFF, ...): a raw
# value of these never makes a GOOD reading.
SENTINEL_RAWS = frozenset({-1, -10, -410, -9999, -99999, 0xFFFF, 0x7FFFFFFF, -0x80000000})
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "snmp"


def _raw_values(recording: Path) -> dict[str, str]:
    out = {}
    for line in recording.read_text().splitlines():
        oid, kind, value = line.split("|", 2)
        if kind in {"2", "65", "66", "70"}:
            out[oid.lstrip(".")] = value
    return out


async def _all_readings(server: SnmpsimServer, recording: Path) -> list[Reading]:
    adapter = _adapter(server, recording.stem)
    try:
        await adapter.connect()
        return list(await adapter.read())
    finally:
        await adapter.close()


async def test_no_sentinel_is_good_in_any_recording(snmpsim: SnmpsimServer) -> None:
    fixtures = SnmpsimServer(sorted(FIXTURES.glob("*.snmprec")))
    await asyncio.to_thread(fixtures.start)
    checked = 0
    try:
        for server, folder in ((snmpsim, DATA), (fixtures, FIXTURES)):
            for recording in sorted(folder.glob("*.snmprec")):
                raws = _raw_values(recording)
                for r in await _all_readings(server, recording):
                    if r.quality is not Quality.GOOD:
                        assert r.reason, (
                            f"{recording.stem} {r.sensor}: {r.quality} without a reason"
                        )
                        continue
                    raw = raws.get(r.labels["oid"])
                    checked += 1
                    assert raw is None or int(raw) not in SENTINEL_RAWS, (
                        f"{recording.stem} {r.sensor} = {r.value} {r.unit} from raw {raw}: GOOD"
                    )
    finally:
        await asyncio.to_thread(fixtures.stop)
    assert checked > 150
