"""The OPC 40082-1 TCD model: the fake server loads the real nodesets, the profile reads them.

Needs ../shared/data/opcua (the OPC Foundation nodesets); skipped without it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from adapters.sensors.opcua import OpcuaAdapter, OpcuaSettings
from adapters.sensors.opcua_profiles import load_profile
from adapters.sensors.opcua_session import SessionSettings
from fakes.cdu_server import ALARM_SEVERITY, FakeCduServer, nodesets_available
from fakes.sim import RackSimulator, load_scenario
from fakes.sim.thermal import CduSnapshot
from policies.model import Quality, Reading
from tests.support.paths import SHARED_DATA

NODESETS = SHARED_DATA / "opcua"

pytestmark = pytest.mark.skipif(
    not nodesets_available(NODESETS),
    reason=f"OPC 40082-1 TCD nodesets not found under {NODESETS} (shared data absent)",
)


@pytest.fixture
async def server() -> AsyncIterator[FakeCduServer]:
    srv = FakeCduServer(model="tcd", nodeset_dir=NODESETS)
    await srv.start()
    yield srv
    await srv.stop()


def expected(cdu: CduSnapshot) -> dict[str, float]:
    return {
        "cdu.supply_temperature": cdu.supply_c,
        "cdu.return_temperature": cdu.return_c,
        "cdu.flow": cdu.flow_lpm,
        "cdu.differential_pressure": cdu.differential_pressure_kpa,  # served in bar
        "cdu.pump_speed": cdu.pump_speed_pct,
        "cdu.pump_state": 1.0 if cdu.pump_running else 0.0,
        "cdu.alarm": float(ALARM_SEVERITY) if cdu.alarm else 0.0,
    }


async def read_until(adapter: OpcuaAdapter, want: dict[str, float]) -> list[Reading]:
    deadline = time.monotonic() + 5
    got: list[Reading] = []
    while time.monotonic() < deadline:
        got = list(await adapter.read())
        values = {r.sensor: r.value for r in got}
        if all(values.get(k) == pytest.approx(v, rel=1e-9, abs=1e-9) for k, v in want.items()):
            return got
        await asyncio.sleep(0.05)
    pytest.fail(f"values never became {want}: {[(r.sensor, r.value) for r in got]}")


async def test_tcd_instance_follows_the_simulator_through_a_pump_failure(
    server: FakeCduServer,
) -> None:
    sim = RackSimulator(load_scenario("pump-failure"), seed=3)
    sim.run_until(170.0)
    before = sim.snapshot().cdu
    await server.publish(before)
    adapter = OpcuaAdapter(
        "cdu",
        OpcuaSettings(
            SessionSettings(server.url),
            load_profile("opc40082-tcd"),
            sampling_interval_s=0.1,
            keepalive_s=0.5,
            stale_after_s=2.0,
            bad_after_s=4.0,
        ),
    )
    try:
        await adapter.connect()
        readings = await read_until(adapter, expected(before))
        assert all(r.quality is Quality.GOOD for r in readings)
        assert {r.sensor: r.unit for r in readings}["cdu.differential_pressure"] == "kilopascals"
        assert "ns=" in readings[0].labels["node_id"]
        sim.run_until(200.0)  # the pump failed at 180 s
        after = sim.snapshot().cdu
        assert not after.pump_running and after.flow_lpm < 0.1 * before.flow_lpm
        await server.publish(after)
        got = {r.sensor: r.value for r in await read_until(adapter, expected(after))}
        assert got["cdu.pump_state"] == 0.0
        assert got["cdu.alarm"] == ALARM_SEVERITY
        assert got["cdu.differential_pressure"] == pytest.approx(after.differential_pressure_kpa)
    finally:
        await adapter.close()
