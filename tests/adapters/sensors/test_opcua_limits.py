"""OperationLimits: the fake CDU states small ones and answers BadTooManyOperations past them."""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator

import pytest
from asyncua import ua
from asyncua.ua.status_codes import StatusCodes
from asyncua.ua.uaerrors import UaStatusCodeError

from adapters.errors import SourceUnavailable
from adapters.sensors.opcua import OpcuaAdapter
from adapters.sensors.opcua_limits import LIMIT_NODES, Service
from adapters.sensors.opcua_limits import OperationLimits as ClientLimits
from fakes.cdu_server import FakeCduServer
from fakes.opcua_limits import OperationLimits
from policies.model import Quality
from tests.adapters.sensors.test_opcua import (
    NORMAL,
    PUMP_FAILED,
    expected_values,
    read_until,
    server,
    settings,
    values,
)

__all__ = ["server"]  # the fake CDU fixture, shared with test_opcua.py

VARIABLES = len(expected_values(NORMAL))


async def _limited(limits: OperationLimits) -> FakeCduServer:
    srv = FakeCduServer(model="generic", operation_limits=limits)
    await srv.start()
    await srv.publish(NORMAL)
    return srv


@pytest.fixture
async def small() -> AsyncIterator[FakeCduServer]:
    """Stated and enforced: 3 nodes per Read, 4 paths per Translate, 2 items per call."""
    srv = await _limited(OperationLimits(read=3, translate=4, monitored_items=2))
    yield srv
    await srv.stop()


@pytest.fixture
async def unstated() -> AsyncIterator[FakeCduServer]:
    """The same limits enforced, but the server states none of them."""
    srv = await _limited(OperationLimits(read=3, translate=4, monitored_items=2, stated=False))
    yield srv
    await srv.stop()


def _limits(srv: FakeCduServer) -> OperationLimits:
    assert srv.operation_limits is not None
    return srv.operation_limits


async def test_poll_reads_every_variable_within_max_nodes_per_read(
    small: FakeCduServer,
) -> None:
    adapter = OpcuaAdapter("cdu", settings(small, mode="poll"))
    try:
        await adapter.connect()
        assert adapter.limits.stated == {
            "Read": 3,
            "TranslateBrowsePathsToNodeIds": 4,
            "CreateMonitoredItems": 2,
        }
        readings = await adapter.read()
        assert all(r.quality is Quality.GOOD for r in readings), readings
        assert values(readings) == pytest.approx(expected_values(NORMAL))
        before = _limits(small).requests["Read"]
        await small.publish(PUMP_FAILED)
        assert values(await adapter.read()) == pytest.approx(expected_values(PUMP_FAILED))
        assert _limits(small).requests["Read"] - before == math.ceil(VARIABLES / 3)
    finally:
        await adapter.close()
    assert not _limits(small).refused


async def test_subscription_creates_every_item_within_max_monitored_items_per_call(
    small: FakeCduServer,
) -> None:
    adapter = OpcuaAdapter("cdu", settings(small))
    try:
        await adapter.connect()
        assert not adapter.polling
        readings = await adapter.read()
        assert all(r.quality is Quality.GOOD for r in readings), readings
        reads = _limits(small).requests["Read"]
        await small.publish(PUMP_FAILED)
        await read_until(adapter, expected_values(PUMP_FAILED))
        assert _limits(small).requests["Read"] == reads  # changes came by subscription
    finally:
        await adapter.close()
    assert _limits(small).requests["CreateMonitoredItems"] == math.ceil(VARIABLES / 2)
    assert not _limits(small).refused


async def test_unstated_limits_are_learnt_from_bad_too_many_operations(
    unstated: FakeCduServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="adapters.sensors.opcua_limits")
    adapter = OpcuaAdapter("cdu", settings(unstated))
    try:
        await adapter.connect()
        assert adapter.limits.stated == {
            "Read": 0,
            "TranslateBrowsePathsToNodeIds": 0,
            "CreateMonitoredItems": 0,
        }
        readings = await adapter.read()
        assert all(r.quality is Quality.GOOD for r in readings), readings
        assert values(readings) == pytest.approx(expected_values(NORMAL))
        refused = sum(_limits(unstated).refused.values())
        await adapter.connect()  # a reconnect keeps what was learnt: nothing refused again
        assert sum(_limits(unstated).refused.values()) == refused
        assert values(await adapter.read()) == pytest.approx(expected_values(NORMAL))
    finally:
        await adapter.close()
    said = [r.getMessage() for r in caplog.records if r.name == "adapters.sensors.opcua_limits"]
    assert len(said) == refused
    for service in ("Read", "TranslateBrowsePathsToNodeIds", "CreateMonitoredItems"):
        assert any(f"to a {service} of" in m and "not stated" in m for m in said), said


async def test_a_refused_single_operation_is_an_error_naming_the_service() -> None:
    calls: list[int] = []

    async def refuse(chunk: list[int]) -> list[int]:
        calls.append(len(chunk))
        raise UaStatusCodeError(StatusCodes.BadTooManyOperations)  # type: ignore[no-untyped-call]

    limits = ClientLimits(stated={"Read": 4})
    with pytest.raises(SourceUnavailable, match=r"Read of 1 operation refused.*MaxNodesPerRead 4"):
        await limits.call("Read", "opc.tcp://x", list(range(10)), refuse)
    assert calls == [4, 2, 1]


async def test_a_short_answer_is_an_error_not_a_traceback() -> None:
    async def short(chunk: list[int]) -> list[int]:
        return chunk[:-1]

    with pytest.raises(SourceUnavailable, match="Read of 3 operations answered 2 results"):
        await ClientLimits().call("Read", "opc.tcp://x", [1, 2, 3], short)


async def test_zero_or_bad_stated_limits_mean_no_limit(server: FakeCduServer) -> None:
    """0 is "no limit" (Part 5 6.3.11), and so is a limit the server cannot read."""
    srv = server._server
    assert srv is not None
    unreadable = ua.StatusCode(ua.UInt32(StatusCodes.BadNotReadable))
    odd: dict[Service, ua.DataValue] = {
        "Read": ua.DataValue(ua.Variant(0, ua.VariantType.UInt32)),
        "TranslateBrowsePathsToNodeIds": ua.DataValue(
            ua.Variant(4, ua.VariantType.UInt32), StatusCode=unreadable
        ),
        "CreateMonitoredItems": ua.DataValue(
            ua.Variant(2, ua.VariantType.UInt32), StatusCode=unreadable
        ),
    }
    for service, dv in odd.items():
        await srv.write_attribute_value(ua.NodeId(ua.Int32(LIMIT_NODES[service][1])), dv)
    adapter = OpcuaAdapter("cdu", settings(server))
    try:
        await adapter.connect()
        assert adapter.limits.stated == dict.fromkeys(odd, 0)
        assert values(await adapter.read()) == pytest.approx(expected_values(NORMAL))
    finally:
        await adapter.close()
