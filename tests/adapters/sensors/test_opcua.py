"""OpcuaAdapter against the fake CDU server (generic model) over TCP on loopback."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from typing import Any

import pytest

from adapters.errors import SourceSetupError, SourceUnavailable
from adapters.sensors.opcua import OpcuaAdapter, OpcuaSettings
from adapters.sensors.opcua_profiles import load_profile
from adapters.sensors.opcua_session import SessionSettings
from daemon.config.sources import SourceTiming
from daemon.service.runner import SourceRunner
from fakes.cdu_server import FakeCduServer, free_port
from fakes.sim.thermal import CduSnapshot
from policies.model import Quality, Reading, SensorKind
from tests.support.wait import wait_for_result

NORMAL = CduSnapshot(30.0, 37.5, 40.0, 120.0, 70.0, True, False, False)
PUMP_FAILED = CduSnapshot(33.0, 39.0, 1.5, 0.2, 0.0, False, True, True)

EXPECTED_KINDS = {
    "cdu.supply_temperature": (SensorKind.COOLANT_SUPPLY_TEMPERATURE, "celsius"),
    "cdu.return_temperature": (SensorKind.COOLANT_RETURN_TEMPERATURE, "celsius"),
    "cdu.flow": (SensorKind.COOLANT_FLOW, "liters_per_minute"),
    "cdu.differential_pressure": (SensorKind.COOLANT_DIFFERENTIAL_PRESSURE, "kilopascals"),
    "cdu.pump_speed": (SensorKind.PUMP_SPEED, "percent"),
    "cdu.pump_state": (SensorKind.PUMP_STATE, "bool"),
    "cdu.leak": (SensorKind.LEAK, "bool"),
    "cdu.alarm": (SensorKind.ALARM, "bool"),
}


def expected_values(cdu: CduSnapshot) -> dict[str, float]:
    """What the adapter must report for a snapshot (generic model: canonical units)."""
    return {
        "cdu.supply_temperature": cdu.supply_c,
        "cdu.return_temperature": cdu.return_c,
        "cdu.flow": cdu.flow_lpm,
        "cdu.differential_pressure": cdu.differential_pressure_kpa,
        "cdu.pump_speed": cdu.pump_speed_pct,
        "cdu.pump_state": 1.0 if cdu.pump_running else 0.0,
        "cdu.leak": 1.0 if cdu.leak else 0.0,
        "cdu.alarm": 1.0 if cdu.alarm else 0.0,
    }


def settings(server: FakeCduServer, **kw: Any) -> OpcuaSettings:
    """Fast settings for tests: 100 ms sampling, short staleness limits."""
    base = OpcuaSettings(
        session=SessionSettings(server.url, request_timeout_s=2.0),
        profile=load_profile("generic"),
        sampling_interval_s=0.1,
        keepalive_s=0.3,
        stale_after_s=1.0,
        bad_after_s=2.0,
    )
    return replace(base, **kw)


def by_sensor(readings: Sequence[Reading]) -> dict[str, Reading]:
    return {r.sensor: r for r in readings}


def values(readings: Sequence[Reading]) -> dict[str, float | None]:
    return {r.sensor: r.value for r in readings}


async def read_until(
    adapter: OpcuaAdapter, want: dict[str, float], within_s: float = 5.0
) -> list[Reading]:
    """Read every 50 ms until the values match ``want`` (pytest.fail on timeout)."""
    deadline = time.monotonic() + within_s
    got: list[Reading] = []
    while time.monotonic() < deadline:
        got = list(await adapter.read())
        current = values(got)
        if all(current.get(k) == pytest.approx(v) for k, v in want.items()):
            return got
        await asyncio.sleep(0.05)
    pytest.fail(f"values never became {want}; last {values(got)}")


@pytest.fixture
async def server() -> AsyncIterator[FakeCduServer]:
    """A generic-model fake CDU on a free loopback port, publishing NORMAL."""
    srv = FakeCduServer(model="generic")
    await srv.start()
    await srv.publish(NORMAL)
    yield srv
    await srv.stop()


@pytest.fixture
async def adapter(server: FakeCduServer) -> AsyncIterator[OpcuaAdapter]:
    a = OpcuaAdapter("cdu", settings(server))
    yield a
    await a.close()


async def test_subscription_reports_every_variable_with_kind_unit_and_timestamp(
    server: FakeCduServer, adapter: OpcuaAdapter
) -> None:
    await adapter.connect()
    assert not adapter.polling
    readings = await adapter.read()
    assert {r.sensor: (r.kind, r.unit) for r in readings} == EXPECTED_KINDS
    assert values(readings) == pytest.approx(expected_values(NORMAL))
    for r in readings:
        assert r.quality is Quality.GOOD, r
        assert r.source == "cdu"
        assert r.device_ts is not None and abs(r.device_ts - time.time()) < 60
        assert r.server_ts is not None and abs(r.server_ts - time.time()) < 60
        assert r.labels["node_id"] == server.node_id(r.sensor.removeprefix("cdu."))


async def test_subscription_delivers_changes_without_reading(
    server: FakeCduServer, adapter: OpcuaAdapter
) -> None:
    await adapter.connect()
    # From now on every Read takes 3 s: values arriving quickly came by subscription.
    server.slow_s = 3.0
    await server.publish(PUMP_FAILED)
    began = time.monotonic()
    readings = await read_until(adapter, expected_values(PUMP_FAILED))
    assert time.monotonic() - began < 2.0
    assert all(r.quality is Quality.GOOD for r in readings)


async def test_poll_fallback_when_the_server_refuses_subscriptions(
    server: FakeCduServer, adapter: OpcuaAdapter
) -> None:
    server.refuse_subscriptions = True
    await adapter.connect()
    assert adapter.polling
    assert values(await adapter.read()) == pytest.approx(expected_values(NORMAL))
    await server.publish(PUMP_FAILED)
    # Polling: the very next read sees the new values.
    assert values(await adapter.read()) == pytest.approx(expected_values(PUMP_FAILED))


async def test_poll_mode_reads_current_values(server: FakeCduServer) -> None:
    a = OpcuaAdapter("cdu", settings(server, mode="poll"))
    try:
        await a.connect()
        assert a.polling
        await server.publish(PUMP_FAILED)
        assert values(await a.read()) == pytest.approx(expected_values(PUMP_FAILED))
    finally:
        await a.close()


@pytest.mark.parametrize("mode", ["subscription", "poll"])
async def test_status_codes_map_to_quality_with_the_code_name(
    server: FakeCduServer, mode: str
) -> None:
    a = OpcuaAdapter("cdu", settings(server, mode=mode))
    try:
        await a.connect()
        await server.set_status("flow", "BadSensorFailure")
        await server.set_status("supply_temperature", "UncertainLastUsableValue")
        deadline = time.monotonic() + 5
        while True:
            got = by_sensor(await a.read())
            if got["cdu.flow"].quality is Quality.BAD or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        assert got["cdu.flow"].quality is Quality.BAD
        assert got["cdu.flow"].value is None
        assert got["cdu.flow"].reason == "BadSensorFailure"
        supply = got["cdu.supply_temperature"]
        assert supply.quality is Quality.UNCERTAIN
        assert supply.value == pytest.approx(NORMAL.supply_c)
        assert supply.reason == "UncertainLastUsableValue"
        assert got["cdu.return_temperature"].quality is Quality.GOOD
        await server.set_status("flow", None)
        await read_until(a, {"cdu.flow": NORMAL.flow_lpm})
    finally:
        await a.close()


async def test_out_of_range_value_is_bad(server: FakeCduServer, adapter: OpcuaAdapter) -> None:
    await adapter.connect()
    await server.publish(replace(NORMAL, supply_c=900.0))
    deadline = time.monotonic() + 5
    while (supply := by_sensor(await adapter.read())["cdu.supply_temperature"]).usable:
        assert time.monotonic() < deadline, "the out-of-range value never arrived"
        await asyncio.sleep(0.05)
    assert supply.quality is Quality.BAD
    assert supply.reason.startswith("out of range: 900")


async def test_stalled_server_turns_stale_then_bad_then_the_session_is_rebuilt(
    server: FakeCduServer, adapter: OpcuaAdapter
) -> None:
    await adapter.connect()
    assert all(r.quality is Quality.GOOD for r in await adapter.read())
    server.stall()
    seen: list[Quality] = []
    reasons: list[str] = []
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline:
        try:
            readings = await adapter.read()
        except SourceUnavailable as err:
            assert "silent" in str(err)
            break
        qualities = {r.quality for r in readings}
        assert len(qualities) == 1, "staleness applies to the whole subscription"
        if not seen or seen[-1] is not readings[0].quality:
            seen.append(readings[0].quality)
            reasons.append(readings[0].reason)
        await asyncio.sleep(0.05)
    else:
        pytest.fail(f"a stalled server never made read() raise; qualities {seen}")
    assert seen == [Quality.GOOD, Quality.UNCERTAIN, Quality.BAD]
    assert reasons[1].startswith("stale: nothing from the server for")
    assert reasons[2].startswith("stale:")
    # The runner would now reconnect; once the server publishes again, values are GOOD.
    server.stall(False)
    await server.publish(PUMP_FAILED)
    await adapter.connect()
    assert values(await adapter.read()) == pytest.approx(expected_values(PUMP_FAILED))


async def test_steady_values_stay_good_on_keepalives(
    server: FakeCduServer, adapter: OpcuaAdapter
) -> None:
    await adapter.connect()
    # No change for longer than stale_after_s (1 s): keep-alives prove the values current,
    # at every read through that silence, up to half as long again past it.
    silent_until = time.monotonic() + 1.5 * adapter.settings.stale_after_s
    reads = 0
    while time.monotonic() < silent_until:
        assert all(r.quality is Quality.GOOD for r in await adapter.read())
        reads += 1
        await asyncio.sleep(0.1)
    assert reads >= 10
    assert all(r.quality is Quality.GOOD for r in await adapter.read())


async def test_closed_connection_raises_at_once(
    server: FakeCduServer, adapter: OpcuaAdapter
) -> None:
    await adapter.connect()
    await server.stop()
    deadline = time.monotonic() + 3
    with pytest.raises(SourceUnavailable, match=r"lost|read failed"):
        while time.monotonic() < deadline:
            await adapter.read()
            await asyncio.sleep(0.02)


async def test_slow_server_read_can_be_timed_out_and_closed(server: FakeCduServer) -> None:
    a = OpcuaAdapter("cdu", settings(server, mode="poll"))
    await a.connect()
    server.slow_s = 2.0
    began = time.monotonic()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.3):
            await a.read()
    await a.close()
    assert time.monotonic() - began < 1.5, "close() must not wait for the slow server"


async def test_unreachable_server_is_unavailable() -> None:
    url = f"opc.tcp://127.0.0.1:{free_port()}/nothing"
    a = OpcuaAdapter(
        "cdu", OpcuaSettings(SessionSettings(url, request_timeout_s=1.0), load_profile("generic"))
    )
    with pytest.raises(SourceUnavailable, match=r"127\.0\.0\.1"):
        await a.connect()
    with pytest.raises(SourceUnavailable, match="not connected"):
        await a.read()


async def test_wrong_root_is_a_setup_error_naming_it(server: FakeCduServer) -> None:
    a = OpcuaAdapter("cdu", settings(server, root="cdu:NoSuchCdu"))
    with pytest.raises(SourceSetupError, match=r"root 'cdu:NoSuchCdu' not found.*BadNoMatch"):
        await a.connect()


async def test_configured_node_ids_are_used_and_a_wrong_one_is_bad_alone(
    server: FakeCduServer,
) -> None:
    nodes = {
        "flow": server.node_id("flow"),
        "leak": "ns=2;s=NoSuchNode",
        "supply_temperature": "nsu=urn:rackguard:cdu;s=CDU-1.SupplyTemperature",
    }
    a = OpcuaAdapter("cdu", settings(server, nodes=nodes, mode="poll"))
    try:
        await a.connect()
        got = by_sensor(await a.read())
        assert got["cdu.flow"].value == pytest.approx(NORMAL.flow_lpm)
        assert got["cdu.supply_temperature"].value == pytest.approx(NORMAL.supply_c)
        assert got["cdu.leak"].quality is Quality.BAD
        assert got["cdu.leak"].reason == "BadNodeIdUnknown"
        assert got["cdu.return_temperature"].usable
    finally:
        await a.close()


async def test_variable_subset(server: FakeCduServer) -> None:
    a = OpcuaAdapter("cdu", settings(server, variables=("flow", "leak")))
    try:
        await a.connect()
        assert [r.sensor for r in await a.read()] == ["cdu.flow", "cdu.leak"]
    finally:
        await a.close()


@pytest.mark.parametrize("change_node_ids", [False, True], ids=["same-nodeids", "new-nodeids"])
async def test_server_restart_recovers_within_two_reconnect_intervals(
    server: FakeCduServer, change_node_ids: bool
) -> None:
    timing = SourceTiming(
        interval_s=0.5, timeout_s=0.4, backoff_initial_s=0.5, backoff_max_s=1.0, down_after=3
    )
    # Worst case between a failed attempt and the next: the capped backoff plus one tick.
    reconnect_interval = timing.backoff_max_s * 1.2 + timing.interval_s
    received: list[tuple[float, dict[str, Reading]]] = []

    def on_readings(_source: str, readings: Sequence[Reading]) -> None:
        received.append((time.monotonic(), by_sensor(readings)))

    adapter = OpcuaAdapter("cdu", settings(server))
    runner = SourceRunner(adapter, timing, on_readings)
    task = asyncio.create_task(runner.run())
    try:
        await read_runner_until(received, NORMAL.flow_lpm, within_s=5)
        old_node = server.node_id("flow")
        await server.restart(change_node_ids=change_node_ids, downtime_s=0.5)
        assert (server.node_id("flow") != old_node) is change_node_ids
        back = time.monotonic()
        await server.publish(PUMP_FAILED)
        at = await read_runner_until(received, PUMP_FAILED.flow_lpm, within_s=10)
        assert at - back <= 2 * reconnect_interval, f"took {at - back:.2f}s"
        assert runner.stats.failures >= 1  # the dead session was noticed, not hidden
        assert adapter.polling is False
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_a_reply_racing_the_attempt_timeout_fails_the_attempt_not_the_runner(
    server: FakeCduServer,
) -> None:
    """asyncua cancels through wait_for2, whose CancelledError subclass (a reply that
    landed with the cancel) slipped past asyncio.timeout: the attempt raised a
    cancellation and the source's runner ended for good (CI, stop 41: the CDU's first
    connect timed out under load, and nothing was ever read again)."""
    timing = SourceTiming(
        interval_s=1.0, timeout_s=1.0, backoff_initial_s=1.0, backoff_max_s=1.0, down_after=3
    )
    outcomes: list[bool] = []
    # Time limits across a whole connect (~8 ms on an idle 2-core VM), one runner each.
    for step in range(1, 61):
        adapter = OpcuaAdapter("cdu", settings(server))
        runner = SourceRunner(adapter, timing, lambda _s, _r: None)
        runner.poller.timeout_s = step * 0.0005
        try:
            outcomes.append(await runner.attempt())  # never raises
        finally:
            await adapter.close()
        if not outcomes[-1]:
            assert runner.stats.last_error == f"timed out after {step * 0.0005:g}s"
    assert False in outcomes and True in outcomes, outcomes  # the scan crossed the connect
    current = asyncio.current_task()
    assert current is not None and current.cancelling() == 0


async def read_runner_until(
    received: list[tuple[float, dict[str, Reading]]], flow: float, within_s: float
) -> float:
    """The arrival time of the first GOOD flow reading equal to ``flow``."""
    deadline = time.monotonic() + within_s
    seen = 0
    while time.monotonic() < deadline:
        for at, readings in received[seen:]:
            r = readings["cdu.flow"]
            if r.usable and r.value == pytest.approx(flow):
                return at
        seen = len(received)
        await asyncio.sleep(0.02)
    pytest.fail(f"flow {flow} never arrived through the runner")


async def test_secure_channel_is_renewed_before_its_lifetime_ends(server: FakeCduServer) -> None:
    short = SessionSettings(server.url, channel_lifetime_s=1.0)
    a = OpcuaAdapter("cdu", settings(server, session=short, mode="poll"))
    try:
        await a.connect()
        # A read renews a channel that is due; read until three renewals have happened.
        for renewed in range(1, 4):

            def due(_: Sequence[Reading], n: int = renewed) -> bool:
                return a.channel_renewals >= n

            got = await wait_for_result(a.read, due, 5, f"renewal {renewed}")
            assert values(got) == pytest.approx(expected_values(NORMAL))
        assert a.channel_renewals == 3
    finally:
        await a.close()
