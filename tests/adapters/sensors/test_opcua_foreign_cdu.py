"""A cooling unit that does not match our profile, served by a plain asyncua server over TCP.

It states EngineeringUnits in degF, bar and rpm, states none for its flow, lacks the
generic profile's PumpRunning and Alarm, names its flow "FlowRate", and sends a null
(1601-01-01) ServerTimestamp or no SourceTimestamp.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from datetime import UTC
from pathlib import Path
from typing import Any

import pytest
from asyncua import ua
from asyncua.server.server import Server

from adapters.sensors.opcua import OpcuaAdapter
from adapters.sensors.opcua_profiles import unece_code
from daemon.config.opcua import OpcuaSourceConfig
from daemon.config.typed_toml import load_typed
from daemon.service.sources import build_opcua_adapter
from fakes.cdu_server import free_port
from policies.model import Quality, Reading

URI = "urn:rackguard:cdu"
NULL_TIME = ua.DateTime(1601, 1, 1, tzinfo=UTC)
NOW = ua.DateTime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)

# browse name -> (value, variant type, UN/CEFACT unit or "", source ts, server ts)
VARIABLES: dict[str, tuple[Any, ua.VariantType, str, ua.DateTime | None, ua.DateTime]] = {
    "SupplyTemperature": (68.0, ua.VariantType.Double, "FAH", NOW, NULL_TIME),
    "ReturnTemperature": (31.5, ua.VariantType.Double, "CEL", None, NOW),
    "FlowRate": (2.4, ua.VariantType.Double, "", NOW, NOW),  # m3/h, stated nowhere
    "DifferentialPressure": (0.8, ua.VariantType.Double, "BAR", NOW, NOW),
    "PumpSpeed": (3000.0, ua.VariantType.Double, "RPM", NOW, NOW),
    "Leak": (False, ua.VariantType.Boolean, "", NOW, NOW),
}


def _nid(identifier: str, ns: int) -> ua.NodeId:
    return ua.NodeId(ua.String(identifier), ua.Int16(ns))


@pytest.fixture
async def server() -> AsyncIterator[str]:
    url = f"opc.tcp://127.0.0.1:{free_port()}/vendor/cdu"
    srv = Server()
    await srv.init()
    srv.disable_clock(True)
    srv.set_endpoint(url)
    idx = await srv.register_namespace(URI)
    cdu = await srv.nodes.objects.add_object(_nid("CDU-1", idx), ua.QualifiedName("CDU-1", idx))
    for name, (value, vtype, unit, source_ts, server_ts) in VARIABLES.items():
        node = await cdu.add_variable(_nid(name, idx), ua.QualifiedName(name, idx), value, vtype)
        if unit:
            eu = ua.EUInformation(
                NamespaceUri="http://www.opcfoundation.org/UA/units/un/cefact",
                UnitId=unece_code(unit),
                DisplayName=ua.LocalizedText(unit),
            )
            await node.add_property(
                _nid(f"{name}.EU", idx), ua.QualifiedName("EngineeringUnits", 0), eu
            )
        await srv.write_attribute_value(
            node.nodeid,
            ua.DataValue(
                Value=ua.Variant(value, vtype),
                SourceTimestamp=source_ts,
                ServerTimestamp=server_ts,
            ),
        )
    await srv.start()
    try:
        yield url
    finally:
        await srv.stop()


def _adapter(url: str, **extra: Any) -> OpcuaAdapter:
    cfg = load_typed(
        OpcuaSourceConfig,
        {"type": "opcua", "url": url, "mode": "poll", "interval_s": 5.0, **extra},
    )
    return build_opcua_adapter("cdu-x", cfg)


async def _read(adapter: OpcuaAdapter) -> dict[str, Reading]:
    try:
        await adapter.connect()
        return {r.sensor: r for r in await adapter.read()}
    finally:
        await adapter.close()


async def test_engineering_units_are_read_and_converted(server: str) -> None:
    got = await _read(_adapter(server, paths={"flow": "cdu:FlowRate"}))
    supply = got["cdu.supply_temperature"]
    assert supply.quality is Quality.GOOD and supply.unit == "celsius"
    assert supply.value == pytest.approx(20.0)  # 68 degF
    dp = got["cdu.differential_pressure"]
    assert dp.unit == "kilopascals" and dp.value == pytest.approx(80.0)  # 0.8 bar
    pump = got["cdu.pump_speed"]
    assert pump.quality is Quality.GOOD, pump.reason
    assert pump.unit == "rpm" and pump.value == 3000.0


async def test_a_unit_override_applies_when_the_server_states_none(
    server: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="adapters.sensors.opcua")
    adapter = _adapter(
        server, paths={"flow": "cdu:FlowRate"}, units={"flow": "cubic_meters_per_hour"}
    )
    got = await _read(adapter)
    flow = got["cdu.flow"]
    assert flow.unit == "liters_per_minute" and flow.value == pytest.approx(40.0)
    said = [
        r.getMessage() for r in caplog.records if "states no EngineeringUnits" in r.getMessage()
    ]
    assert len(said) == 1 and "flow" in said[0] and "cubic_meters_per_hour" in said[0]
    await _read(adapter)  # a reconnect does not say it again
    again = [r for r in caplog.records if "states no EngineeringUnits" in r.getMessage()]
    assert len(again) == 1


async def test_missing_profile_variables_are_absent_and_named_with_a_hint(
    server: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="adapters.sensors.opcua")
    adapter = _adapter(server, paths={"flow": "cdu:FlowRate"})
    got = await _read(adapter)
    for key in ("cdu.pump_state", "cdu.alarm"):
        assert got[key].quality is Quality.ABSENT and got[key].value is None
        assert "not found" in got[key].reason
    assert got["cdu.leak"].quality is Quality.GOOD
    (note,) = adapter.notes
    assert "pump_state" in note and "alarm" in note and "leak" not in note.split(":")[2]
    assert "nodes.KEY" in note and "paths.KEY" in note and "variables = [" in note
    warnings = [r.getMessage() for r in caplog.records if "not found on" in r.getMessage()]
    assert len(warnings) == 1 and "cdu-x" in warnings[0]


async def test_null_server_timestamp_is_none_and_device_ts_falls_back(server: str) -> None:
    got = await _read(_adapter(server, paths={"flow": "cdu:FlowRate"}))
    supply = got["cdu.supply_temperature"]
    assert supply.server_ts is None  # 1601-01-01, not -11644473600
    assert supply.device_ts == NOW.timestamp()
    ret = got["cdu.return_temperature"]
    assert ret.server_ts == NOW.timestamp()
    assert ret.device_ts == ret.server_ts  # no SourceTimestamp: the server's time


async def test_a_site_profile_from_profile_dir_fits_the_unit(server: str, tmp_path: Path) -> None:
    (tmp_path / "vendor-x.toml").write_text(
        'name = "vendor-x"\nroot = "v:CDU-1"\n[namespaces]\nv = "urn:rackguard:cdu"\n'
        '[variables.supply_temperature]\nkind = "coolant_supply_temperature"\n'
        'path = "v:SupplyTemperature"\n'
        '[variables.flow]\nkind = "coolant_flow"\npath = "v:FlowRate"\n'
        'unit = "cubic_meters_per_hour"\n'
    )
    adapter = _adapter(server, profile="vendor-x", profile_dir=str(tmp_path))
    got = await _read(adapter)
    assert set(got) == {"cdu.supply_temperature", "cdu.flow"}
    assert all(r.quality is Quality.GOOD for r in got.values())
    assert got["cdu.flow"].value == pytest.approx(40.0)
    assert adapter.notes == []
