"""The adapter against a real UDP agent with faults: dead, slow, garbage, tooBig, missing OIDs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from adapters.errors import SourceSetupError, SourceUnavailable
from adapters.sensors.snmp import SnmpAdapter, SnmpOptions
from adapters.sensors.snmp_client import V2cClient
from fakes.sim import RackSimulator, load_scenario
from fakes.snmp_agent import SimulatedPdu, SnmpAgent, oid, sentry4_values
from fakes.snmp_recording import UdpFaultProxy
from policies.model import Quality, SensorKind


def _adapter(agent: SnmpAgent, name: str = "pdu", **options: object) -> SnmpAdapter:
    timeout = float(options.pop("request_timeout_s", 0.3))  # type: ignore[arg-type]
    client = V2cClient("127.0.0.1", agent.port, agent.community, timeout_s=timeout, retries=0)
    return SnmpAdapter(name, client, SnmpOptions(**options))  # type: ignore[arg-type]


@pytest.fixture
def sim() -> RackSimulator:
    return RackSimulator(load_scenario("hot-gpu"), seed=1)


@pytest.fixture
async def pdu(sim: RackSimulator) -> AsyncIterator[SimulatedPdu]:
    agent = SimulatedPdu(lambda: sim.snapshot(noise=False))
    await agent.start()
    yield agent
    await agent.stop()


async def test_simulated_pdu_follows_the_simulator(pdu: SimulatedPdu, sim: RackSimulator) -> None:
    adapter = _adapter(pdu, probe_positions=pdu.probe_positions)
    try:
        await adapter.connect()
        assert adapter.profile is not None and adapter.profile.id == "sentry4"
        for t in (0.0, 900.0):
            sim.run_until(t)
            snap = sim.snapshot(noise=False)
            readings = {r.sensor: r for r in await adapter.read()}
            for position in ("bottom", "middle", "top"):
                r = readings[f"inlet.{position}.temperature"]
                assert r.kind is SensorKind.INLET_TEMPERATURE
                assert r.labels["probe"] == position
                assert r.value == pytest.approx(snap.inlet_c[position], abs=0.051)
            for phase in ("L1", "L2", "L3"):
                current = readings[f"phase.{phase}.current"]
                assert current.value == pytest.approx(snap.pdu_current_a[phase], abs=0.006)
                power = readings[f"phase.{phase}.power"]
                assert power.value == pytest.approx(snap.pdu_power_w[phase], abs=0.51)
    finally:
        await adapter.close()


async def test_a_dead_pdu_does_not_delay_another(pdu: SimulatedPdu, sim: RackSimulator) -> None:
    dead = SnmpAgent(sentry4_values(sim.snapshot(noise=False)))
    await dead.start()
    slow_one = _adapter(dead, "dead-pdu", poll_deadline_s=1.5, request_timeout_s=5.0)
    good = _adapter(pdu, "good-pdu", poll_deadline_s=1.0)
    try:
        await slow_one.connect()
        await good.connect()
        dead.mode = "no_answer"
        loop = asyncio.get_running_loop()
        began = loop.time()
        finished: dict[str, float] = {}

        async def timed(adapter: SnmpAdapter) -> object:
            try:
                return await adapter.read()
            finally:
                finished[adapter.name] = loop.time() - began

        results = await asyncio.gather(timed(slow_one), timed(good), return_exceptions=True)
        assert isinstance(results[0], SourceUnavailable)
        assert "poll did not finish within 1.5s" in str(results[0])
        assert isinstance(results[1], list) and results[1]
        assert all(r.quality is Quality.GOOD for r in results[1])
        # The good PDU answered well inside its own deadline, not after the dead one's.
        assert finished["good-pdu"] < 1.0
        assert finished["dead-pdu"] == pytest.approx(1.5, abs=0.5)
    finally:
        await slow_one.close()
        await good.close()
        await dead.stop()


async def test_slow_answers_past_the_deadline_fail_the_poll(pdu: SimulatedPdu) -> None:
    adapter = _adapter(pdu, poll_deadline_s=0.3, request_timeout_s=2.0)
    try:
        await adapter.connect()
        pdu.mode, pdu.delay_s = "slow", 1.0
        with pytest.raises(SourceUnavailable, match=r"did not finish within 0\.3s"):
            await adapter.read()
        pdu.mode, pdu.delay_s = "slow", 0.05
        assert await adapter.read()  # slow but inside the deadline is fine
    finally:
        await adapter.close()


async def test_garbage_values_become_bad_readings(pdu: SimulatedPdu) -> None:
    adapter = _adapter(pdu)
    try:
        await adapter.connect()
        pdu.mode = "garbage"
        readings = await adapter.read()
        assert readings and all(r.quality is Quality.BAD for r in readings)
        assert all(r.reason.startswith("not a number: OctetString") for r in readings)
        pdu.mode = "ok"
        assert all(r.quality is Quality.GOOD for r in await adapter.read())
    finally:
        await adapter.close()


async def test_varbinds_answered_for_other_oids_are_bad_never_misfiled(
    pdu: SimulatedPdu,
) -> None:
    adapter = _adapter(pdu)
    try:
        await adapter.connect()
        good = {r.sensor: r for r in await adapter.read()}
        pdu.mode = "swapped"
        swapped = await adapter.read()
        bad = [r for r in swapped if r.quality is Quality.BAD]
        assert len(bad) == 2
        assert all(r.reason.startswith("agent answered ") for r in bad)
        for r in swapped:  # every other value is still filed under its own sensor
            if r.quality is Quality.GOOD:
                assert r.value == pytest.approx(good[r.sensor].value, abs=1.0), r.sensor
    finally:
        await adapter.close()


async def test_too_big_splits_requests_and_remembers(pdu: SimulatedPdu) -> None:
    adapter = _adapter(pdu, max_varbinds=16)
    try:
        await adapter.connect()
        pdu.too_big_above = 3
        readings = await adapter.read()
        assert readings and all(r.quality is Quality.GOOD for r in readings)
        pdu.varbinds_per_request.clear()
        again = await adapter.read()
        assert [r.value for r in again] == [r.value for r in readings]
        # Learned: the next poll never asks for more than the agent can answer.
        assert pdu.varbinds_per_request and max(pdu.varbinds_per_request) <= 3
    finally:
        await adapter.close()


async def test_missing_oids_are_bad_readings(sim: RackSimulator) -> None:
    values = sentry4_values(sim.snapshot(noise=False))
    agent = SnmpAgent(values)
    await agent.start()
    adapter = _adapter(agent)
    try:
        await adapter.connect()
        del values[oid("1.3.6.1.4.1.1718.4.1.5.3.1.6.1.1.1")]  # phase L1 current vanishes
        readings = {r.sensor: r for r in await adapter.read()}
        gone = readings["phase.L1.current"]
        assert gone.quality is Quality.BAD and gone.reason == "noSuchInstance"
        assert readings["phase.L2.current"].quality is Quality.GOOD
    finally:
        await adapter.close()
        await agent.stop()


async def test_out_of_range_values_are_bad(sim: RackSimulator) -> None:
    values = sentry4_values(sim.snapshot(noise=False))
    agent = SnmpAgent(values)
    await agent.start()
    adapter = _adapter(agent)
    try:
        await adapter.connect()
        values[oid("1.3.6.1.4.1.1718.4.1.9.3.1.1.1.1")] = 9999  # 999.9 degC
        readings = {r.labels["probe"]: r for r in await adapter.read() if "probe" in r.labels}
        assert readings["A1"].quality is Quality.BAD
        assert readings["A1"].reason.startswith("out of range: 999.9 celsius")
    finally:
        await adapter.close()
        await agent.stop()


async def test_wrong_community_is_unavailable_and_unknown_device_is_setup_error(
    pdu: SimulatedPdu,
) -> None:
    client = V2cClient("127.0.0.1", pdu.port, b"wrong", timeout_s=0.2, retries=0)
    adapter = SnmpAdapter("pdu", client)
    with pytest.raises(SourceUnavailable, match=r"no answer within 0\.2s"):
        await adapter.connect()
    await adapter.close()

    agent = SnmpAgent({oid("1.3.6.1.2.1.1.2.0"): oid("1.3.6.1.4.1.99999.1")})
    await agent.start()
    stranger = _adapter(agent)
    try:
        with pytest.raises(SourceSetupError, match=r"1\.3\.6\.1\.4\.1\.99999\.1"):
            await stranger.connect()
        forced = _adapter(agent, profile="no-such-profile")
        with pytest.raises(SourceSetupError, match="no profile 'no-such-profile'"):
            await forced.connect()
    finally:
        await agent.stop()


async def test_read_before_connect_and_reconnect(pdu: SimulatedPdu) -> None:
    adapter = _adapter(pdu)
    with pytest.raises(SourceUnavailable, match="not connected"):
        await adapter.read()
    await adapter.connect()
    first = adapter.sensors
    await adapter.connect()  # reconnect closes the old session first
    assert adapter.sensors == first
    await adapter.close()
    await adapter.close()  # idempotent


async def test_fault_proxy_in_front_of_an_agent(pdu: SimulatedPdu) -> None:
    proxy = UdpFaultProxy(pdu.port)
    await proxy.start()
    client = V2cClient("127.0.0.1", proxy.port, pdu.community, timeout_s=0.3, retries=0)
    adapter = SnmpAdapter("proxied", client, SnmpOptions(poll_deadline_s=0.5))
    try:
        await adapter.connect()
        assert all(r.quality is Quality.GOOD for r in await adapter.read())
        proxy.mode, proxy.delay_s = "slow", 0.05
        assert await adapter.read()  # slow, but inside the request timeout
        proxy.delay_s = 1.0
        with pytest.raises(SourceUnavailable, match=r"no answer within 0\.3s"):
            await adapter.read()
        proxy.mode = "no_answer"
        with pytest.raises(SourceUnavailable):
            await adapter.read()
        proxy.mode = "ok"
        assert await adapter.read()
    finally:
        await adapter.close()
        await proxy.stop()


async def stopped_while_closing(adapter: SnmpAdapter) -> bool:
    """Connect and read, then cancel close() as it waits: whether the cancel went on."""
    await adapter.connect()
    await adapter.read()
    closing = asyncio.create_task(adapter.close())
    await asyncio.sleep(0)  # close() now waits for the dispatcher's timer task to end
    closing.cancel()
    await asyncio.gather(closing, return_exceptions=True)
    await adapter.close()  # closed all the same: idempotent
    return closing.cancelled()


async def test_a_stop_while_closing_is_not_swallowed(pdu: SimulatedPdu) -> None:
    # Before: close() returned as if no one had asked, and its caller carried on.
    assert await stopped_while_closing(_adapter(pdu))
