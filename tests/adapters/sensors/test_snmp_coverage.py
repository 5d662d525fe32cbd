"""Every device a profile claims is read, or refused loudly.

Hand-made recordings (tests/fixtures/snmp, written from the vendors' MIBs) served by
snmpsim over UDP: the profiles added from the MIBs read their devices; a device whose
profile reads nothing rackguard uses is degraded (adapter, runner, /readyz) and fails
`probe` with exit 2; sentinels and status columns make BAD readings with the reason;
apparent and reactive power rows are skipped by name.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from adapters.sensors.snmp import SnmpAdapter
from adapters.sensors.snmp_client import V2cClient
from daemon.config.sources import SourceTiming
from daemon.service.runner import Health, SourceRunner
from fakes.snmp_recording import SnmpsimServer
from policies.model import Quality, Reading, SensorKind
from tests.support.openapi import check

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "snmp"
RECORDINGS = [
    "raritan-emx",
    "apc-rack-monitor",
    "apc-cooling",
    "geist-v4",
    "sentry4-no-evidence",
    "apc-rpdu2-unmetered",
    "rittal-cmc3-pdu",
    "apc-inrow-rp500",
    "apc-rpdu-ap7900",
    "vertiv-v5-probes",
]


@pytest.fixture(scope="module")
def snmpsim() -> Iterator[SnmpsimServer]:
    server = SnmpsimServer([FIXTURES / f"{name}.snmprec" for name in RECORDINGS])
    server.start()
    yield server
    server.stop()


def _adapter(server: SnmpsimServer, community: str) -> SnmpAdapter:
    client = V2cClient("127.0.0.1", server.port, community.encode(), timeout_s=2.0, retries=1)
    return SnmpAdapter(f"dev-{community}", client)


async def _read(server: SnmpsimServer, community: str) -> tuple[SnmpAdapter, dict[str, Reading]]:
    adapter = _adapter(server, community)
    try:
        await adapter.connect()
        return adapter, {r.sensor: r for r in await adapter.read()}
    finally:
        await adapter.close()


async def test_raritan_emx_reads_its_probes_and_an_unavailable_one_is_bad(
    snmpsim: SnmpsimServer,
) -> None:
    adapter, got = await _read(snmpsim, "raritan-emx")
    assert adapter.profile is not None and adapter.profile.id == "raritan-emx"
    top = got["inlet.1.temperature"]
    assert top.quality is Quality.GOOD and top.value == pytest.approx(23.1)
    assert top.kind is SensorKind.INLET_TEMPERATURE and top.labels["description"] == "Rack 12 top"
    # A humidity above its warning threshold is still a reading.
    assert got["inlet.2.humidity"].value == pytest.approx(61.0)
    bottom = got["inlet.3.temperature"]
    assert bottom.quality is Quality.BAD
    assert bottom.reason == "device reports status unavailable (-1)"
    assert not any("4" in s for s in got), "a door contact is not a temperature"
    assert adapter.degraded_reason == "" and adapter.missing == []


async def test_apc_rack_monitor_reads_mem_sensors_in_the_system_scale(
    snmpsim: SnmpsimServer,
) -> None:
    adapter, got = await _read(snmpsim, "apc-rack-monitor")
    assert adapter.profile is not None and adapter.profile.id == "apc-rack-monitor"
    front = got["inlet.mem0.1.temperature"]
    assert front.quality is Quality.GOOD and front.unit == "celsius"
    assert front.value == pytest.approx((75 - 32) * 5 / 9)  # memSensorsStatusSysTempUnits = F
    assert got["inlet.mem0.1.humidity"].value == 38.0
    rear = got["inlet.mem0.2.temperature"]
    assert rear.quality is Quality.BAD and rear.reason == "device reports status notInstalled (1)"


async def test_apc_cooling_unit_of_another_family_reads_its_analog_table(
    snmpsim: SnmpsimServer,
) -> None:
    adapter, got = await _read(snmpsim, "apc-cooling")
    assert adapter.profile is not None and adapter.profile.id == "apc-cooling"
    by_name = {r.labels["description"]: r for r in got.values()}
    assert by_name["Supply Air Temperature"].kind is SensorKind.AIR_TEMPERATURE
    assert by_name["Supply Air Temperature"].value == pytest.approx(15.9)
    assert by_name["Return Air Temperature"].value == pytest.approx(30.5)
    fluid_in = by_name["Entering Fluid Temperature"]
    assert fluid_in.kind is SensorKind.COOLANT_SUPPLY_TEMPERATURE and fluid_in.value == 12.0
    assert by_name["Leaving Fluid Temperature"].kind is SensorKind.COOLANT_RETURN_TEMPERATURE
    assert by_name["Return Air Humidity"].value == 41.0
    assert by_name["Fluid Flow"].kind is SensorKind.COOLANT_FLOW
    assert by_name["Fluid Flow"].value == pytest.approx(75.0)  # 1.25 L/s
    # Fan speed (%) and cooling output (kW) are no kind of rackguard's: skipped by name.
    assert "Fan Speed" not in by_name and "Cooling Output" not in by_name
    skipped = next(n for n in adapter.notes if n.startswith("skipped by the profile"))
    assert "analog.1.6 (not read: fan speed" in skipped and "analog.1.7 (" in skipped


async def test_apc_inrow_rp_reads_its_own_scalars_and_lists_the_other_families_once(
    snmpsim: SnmpsimServer,
) -> None:
    adapter, got = await _read(snmpsim, "apc-inrow-rp500")
    assert adapter.profile is not None and adapter.profile.id == "apc-cooling"
    assert got["rp500.supply_air.temperature"].value == pytest.approx(18.2)
    assert got["rp500.return_air.temperature"].value == pytest.approx(29.6)
    assert got["rp500.supply.humidity"].value == pytest.approx(45.2)
    assert got["rp500.rack_inlet1.temperature"].kind is SensorKind.AIR_TEMPERATURE
    # Another family's scalar is not on this unit: ABSENT with the reason, not BAD.
    other = got["rdg2.supply_air.temperature"]
    assert other.quality is Quality.ABSENT and "not on this device" in other.reason
    assert adapter.degraded_reason == ""


async def test_geist_v4_is_tried_when_the_v5_tables_of_the_longer_match_are_empty(
    snmpsim: SnmpsimServer,
) -> None:
    adapter, got = await _read(snmpsim, "geist-v4")
    assert [t.profile.id for t in adapter.trials] == ["vertiv-geist", "geist-v4"]
    assert adapter.profile is not None and adapter.profile.id == "geist-v4"
    assert got["inlet.int1.temperature"].value == pytest.approx(23.4)
    assert got["inlet.int1.humidity"].value == 43.0
    remote = got["inlet.t1.temperature"]
    assert remote.quality is Quality.BAD and "unavailable (0)" in remote.reason
    assert any("also tried profile vertiv-geist" in n for n in adapter.notes), adapter.notes
    assert "(tried first, found nothing rackguard uses: vertiv-geist)" in adapter.notes[0]


async def test_a_matched_profile_that_reads_nothing_is_degraded_and_says_why_once(
    snmpsim: SnmpsimServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="adapters.sensors.snmp")
    adapter = _adapter(snmpsim, "sentry4-no-evidence")
    try:
        await adapter.connect()
        first = await adapter.read()
        second = await adapter.read()
    finally:
        await adapter.close()
    assert adapter.profile is not None and adapter.profile.id == "sentry4"
    assert [r.quality for r in first] == [Quality.BAD] and len(second) == 1
    why = adapter.degraded_reason
    assert why.startswith("profile sentry4 (profiles/sentry4.toml) reads nothing rackguard uses")
    assert "looked for humidity, inlet_temperature, power" in why
    assert "no probe fitted (sentinel -410)" in why and "power: no row on this device" in why
    warned = [r for r in caplog.records if "reads nothing rackguard uses" in r.getMessage()]
    assert len(warned) == 1, [r.getMessage() for r in caplog.records]


async def test_a_partly_read_device_lists_what_is_missing_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = SnmpsimServer([FIXTURES / "sentry3-fahrenheit.snmprec"])
    await asyncio.to_thread(server.start)
    caplog.set_level(logging.INFO, logger="adapters.sensors.snmp")
    adapter = _adapter(server, "sentry3-fahrenheit")
    try:
        await adapter.connect()
        await adapter.read()
        await adapter.connect()
        await adapter.read()
    finally:
        await adapter.close()
        await asyncio.to_thread(server.stop)
    assert adapter.degraded_reason == "" and adapter.missing == ["power"]
    missing = [r for r in caplog.records if "but not power" in r.getMessage()]
    assert len(missing) == 1, [r.getMessage() for r in caplog.records]
    assert "not on this device" in missing[0].getMessage()


async def test_minus_one_energy_and_power_are_bad_not_measured(snmpsim: SnmpsimServer) -> None:
    _, got = await _read(snmpsim, "apc-rpdu2-unmetered")
    assert got["pdu1.power"].value == 1230.0
    energy = got["pdu1.energy"]
    assert energy.quality is Quality.BAD and energy.reason == "not measured (sentinel -1)"
    assert got["pdu2.power"].reason == "not measured (sentinel -1)"
    assert got["pdu2.energy"].value == pytest.approx(4567.8)


async def test_an_rpdu_without_rpdu2_tables_reads_the_device_total(
    snmpsim: SnmpsimServer,
) -> None:
    adapter, got = await _read(snmpsim, "apc-rpdu-ap7900")
    assert adapter.profile is not None and adapter.profile.id == "apc-rpdu2"
    total = got["device.power"]
    assert total.quality is Quality.GOOD and total.value == 840.0
    assert got["phase.L1.current"].value == pytest.approx(7.2)
    assert adapter.degraded_reason == ""


async def test_vertiv_v5_probes_read_in_the_device_temperature_unit(
    snmpsim: SnmpsimServer,
) -> None:
    adapter, got = await _read(snmpsim, "vertiv-v5-probes")
    assert adapter.profile is not None and adapter.profile.id == "vertiv-geist"
    front = got["inlet.thd1.temperature"]
    assert front.quality is Quality.GOOD and front.value == pytest.approx(24.0)  # 75.2 degF
    assert front.labels["description"] == "Rack front"
    assert got["inlet.thd1.humidity"].value == 40.0
    rear = got["inlet.rt1.temperature"]
    assert rear.quality is Quality.BAD and rear.reason == "device reports status unavailable (0)"
    assert got["pdu1.power"].value == 1016.0


async def test_apparent_and_reactive_power_rows_are_skipped_by_name(
    snmpsim: SnmpsimServer,
) -> None:
    adapter, got = await _read(snmpsim, "rittal-cmc3-pdu")
    active = got["dev2.PDU.Phase_L1.Power.Active.Value"]
    assert active.kind is SensorKind.POWER and active.value == 1520.0 and active.unit == "watts"
    assert got["dev2.PDU.Phase_L1.Energy.Active.Value"].value == pytest.approx(12345.6)
    assert {r.unit for r in got.values() if r.kind is SensorKind.POWER} == {"watts"}
    skipped = next(n for n in adapter.notes if n.startswith("skipped by the profile"))
    assert "dev2.PDU.Phase_L1.Power.Apparent.Value (apparent power (VA)" in skipped
    assert "dev2.PDU.Phase_L1.Power.Reactive.Value (reactive power (var)" in skipped


async def test_runner_reports_a_source_without_evidence_degraded_in_readyz(
    snmpsim: SnmpsimServer,
) -> None:
    from daemon.http.view import ServiceView  # noqa: PLC0415
    from daemon.service.state import StateStore  # noqa: PLC0415

    adapter = _adapter(snmpsim, "sentry4-no-evidence")
    store = StateStore()
    runner = SourceRunner(
        adapter, SourceTiming(10.0, 5.0, 1.0, 5.0, 3), store.update, rng=random.Random(1)
    )
    try:
        assert await runner.attempt()
        assert await runner.attempt()
    finally:
        await adapter.close()
    assert runner.health is Health.DEGRADED
    assert runner.stats.last_error == adapter.degraded_reason != ""
    stub: Any = SimpleNamespace(health=list, error="")
    view = ServiceView(
        config=SimpleNamespace,  # type: ignore[arg-type]
        runners=lambda: [runner],
        store=store,
        engine=stub,
        decisions=stub,
        deliverer=stub,
        overrides=stub,
        events=stub,
        simulated=False,
    )
    from daemon.http.bodies import to_wire  # noqa: PLC0415

    body = to_wire(view.readiness())
    check("Ready", body)
    assert body["degraded"] == {adapter.name: adapter.degraded_reason}
    assert view.sources()[0].health == "degraded"


def test_every_shipped_profile_names_its_product_lines_and_mib_tables() -> None:
    from adapters.sensors.snmp_profiles import shipped_profiles  # noqa: PLC0415

    doc = (Path(__file__).resolve().parents[3] / "docs" / "pdu-profiles.md").read_text()
    for profile in shipped_profiles():
        assert profile.products and profile.mib, f"{profile.path}: products and mib"
        assert profile.match or profile.fallback, profile.path
        assert f"| `{profile.id}` |" in doc, f"{profile.id} is not in docs/pdu-profiles.md"
