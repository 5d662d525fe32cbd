"""A Sentry3 recording written from the MIB (Fahrenheit probes, status columns, a
missing column), served by snmpsim over UDP and read through the shipped profile."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from adapters.sensors.snmp import SnmpAdapter, SnmpOptions
from adapters.sensors.snmp_client import V2cClient
from fakes.snmp_recording import SnmpsimServer
from policies.model import Quality, Reading

RECORDING = Path(__file__).resolve().parents[2] / "fixtures" / "snmp" / "sentry3-fahrenheit.snmprec"


@pytest.fixture(scope="module")
def snmpsim() -> Iterator[SnmpsimServer]:
    server = SnmpsimServer([RECORDING])
    server.start()
    yield server
    server.stop()


async def _read(server: SnmpsimServer, options: SnmpOptions | None = None) -> dict[str, Reading]:
    client = V2cClient("127.0.0.1", server.port, RECORDING.stem.encode(), timeout_s=2.0, retries=1)
    adapter = SnmpAdapter("pdu-a", client, options)
    try:
        await adapter.connect()
        assert adapter.profile is not None and adapter.profile.id == "sentry3"
        return {r.sensor: r for r in await adapter.read()}
    finally:
        await adapter.close()


async def test_fahrenheit_scale_column_converts_to_celsius(snmpsim: SnmpsimServer) -> None:
    got = await _read(snmpsim)
    a1, a2 = got["inlet.A1.temperature"], got["inlet.A2.temperature"]
    assert a1.quality is Quality.GOOD and a1.unit == "celsius"
    assert a1.value == pytest.approx(20.0, abs=0.01)  # 68.0 degF
    assert a2.value == pytest.approx(23.61, abs=0.01)  # 74.5 degF
    # The Celsius probes of the same unit stay as they are.
    assert got["inlet.B2.temperature"].value == pytest.approx(23.1)
    # Without a scale column (old firmware) the value is in whole degrees C.
    assert got["inlet.C1.temperature"].value == pytest.approx(22.0)
    # Probes are named as the device's UI names them.
    assert a1.labels["probe"] == "A1" and a1.labels["description"] == "Rack_Front_Bottom"
    assert got["inlet.A1.humidity"].value == 45.0


async def test_status_columns_mark_readings_bad(snmpsim: SnmpsimServer) -> None:
    got = await _read(snmpsim)
    b1 = got["inlet.B1.temperature"]
    assert b1.quality is Quality.BAD and b1.reason == "device reports status readError (5)"
    assert got["inlet.B1.humidity"].quality is Quality.BAD
    ab = got["infeed.AB.current"]
    assert ab.quality is Quality.BAD and ab.reason == "device reports status noComm (7)"
    aa = got["infeed.AA.current"]
    assert aa.quality is Quality.GOOD and aa.value == pytest.approx(4.12)


async def test_a_column_the_unit_lacks_is_absent_and_logged_once(
    snmpsim: SnmpsimServer, caplog: pytest.LogCaptureFixture
) -> None:
    client = V2cClient("127.0.0.1", snmpsim.port, b"sentry3-fahrenheit", timeout_s=2.0, retries=1)
    adapter = SnmpAdapter("pdu-a", client)
    caplog.set_level(logging.INFO, logger="adapters.sensors.snmp")
    try:
        await adapter.connect()
        first = {r.sensor: r for r in await adapter.read()}
        await adapter.connect()  # a reconnect finds the same: nothing new to say
        second = {r.sensor: r for r in await adapter.read()}
    finally:
        await adapter.close()
    for got in (first, second):
        power = got["infeed.AA.power"]
        assert power.quality is Quality.ABSENT and power.value is None
        assert "noSuchInstance" in power.reason
    absent_logs = [r for r in caplog.records if "are not polled" in r.getMessage()]
    assert len(absent_logs) == 1, [r.getMessage() for r in caplog.records]
    assert "infeed.AA.power" in absent_logs[0].getMessage()
    served = [r for r in caplog.records if "serves sysObjectID" in r.getMessage()]
    assert len(served) == 1 and "shipped profile sentry3" in served[0].getMessage()
    assert "verified with" in served[0].getMessage()


@pytest.mark.parametrize("key", ["A1", "1.1"])
async def test_probe_positions_accept_the_device_name_or_the_index(
    snmpsim: SnmpsimServer, key: str
) -> None:
    got = await _read(snmpsim, SnmpOptions(probe_positions={key: "bottom"}))
    assert got["inlet.bottom.temperature"].labels["probe"] == "bottom"
    assert got["inlet.A2.temperature"].labels["probe"] == "A2"


async def test_netbotz_error_status_failure_is_bad_and_alert_levels_are_readings() -> None:
    recording = RECORDING.parent / "netbotz.snmprec"
    server = SnmpsimServer([recording])
    await asyncio.to_thread(server.start)
    client = V2cClient("127.0.0.1", server.port, b"netbotz", timeout_s=2.0, retries=1)
    adapter = SnmpAdapter("room", client)
    try:
        await adapter.connect()
        got = {r.sensor: r for r in await adapter.read()}
    finally:
        await adapter.close()
        await asyncio.to_thread(server.stop)
    assert adapter.profile is not None and adapter.profile.id == "netbotz"
    assert got["inlet.Rack_Top.temperature"].value == pytest.approx(24.3)
    bottom = got["inlet.Rack_Bottom.temperature"]
    assert bottom.quality is Quality.BAD and bottom.reason == "device reports status failure (5)"
    humidity = got["inlet.Rack_Top.humidity"]
    assert humidity.quality is Quality.GOOD and humidity.value == pytest.approx(41.2)
