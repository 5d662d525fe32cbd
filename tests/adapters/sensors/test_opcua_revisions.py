"""What a server may change of our subscription: refused monitored items, a slower keep-alive."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from adapters.sensors.opcua import OpcuaAdapter
from fakes.cdu_server import FakeCduServer
from policies.model import Quality
from tests.adapters.sensors.test_opcua import (
    PUMP_FAILED,
    by_sensor,
    expected_values,
    read_until,
    server,
    settings,
    values,
)

__all__ = ["server"]  # the fake CDU fixture, shared with test_opcua.py

REFUSED = {"flow": "BadTooManyMonitoredItems", "pump_speed": "BadMonitoredItemFilterUnsupported"}


def _said(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "adapters.sensors.opcua" and text in r.getMessage()
    ]


async def test_refused_monitored_items_are_read_instead_and_said_once(
    server: FakeCduServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="adapters.sensors.opcua")
    server.refuse_items = dict(REFUSED)
    adapter = OpcuaAdapter("cdu", settings(server))
    try:
        await adapter.connect()
        assert not adapter.polling
        readings = await adapter.read()
        assert all(r.quality is Quality.GOOD for r in readings), readings
        await server.publish(PUMP_FAILED)
        await read_until(adapter, expected_values(PUMP_FAILED))
        server.stall()  # no publish responses: subscribed values go stale, read ones do not
        await asyncio.sleep(1.3)
        got = by_sensor(await adapter.read())
        assert got["cdu.flow"].quality is Quality.GOOD
        assert got["cdu.supply_temperature"].quality is Quality.UNCERTAIN
        server.stall(False)
        await adapter.connect()
        assert any("BadTooManyMonitoredItems" in n for n in adapter.notes)
    finally:
        await adapter.close()
    (said,) = _said(caplog, "refused monitored items")
    assert "flow (BadTooManyMonitoredItems)" in said
    assert "pump_speed (BadMonitoredItemFilterUnsupported)" in said


async def _polls(server: FakeCduServer, adapter: OpcuaAdapter) -> None:
    """The adapter connects in poll mode and reads current values."""
    try:
        await adapter.connect()
        assert adapter.polling
        await server.publish(PUMP_FAILED)
        assert values(await adapter.read()) == pytest.approx(expected_values(PUMP_FAILED))
    finally:
        await adapter.close()


async def test_every_item_refused_means_polling(server: FakeCduServer) -> None:
    server.refuse_items = dict.fromkeys(server.keys, "BadTooManyMonitoredItems")
    await _polls(server, OpcuaAdapter("cdu", settings(server)))


async def test_a_slower_revised_keepalive_does_not_make_steady_values_stale(
    server: FakeCduServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="adapters.sensors.opcua")
    # Asked: 100 ms x 3 (a keep-alive every 0.3 s); the server revises to 100 ms x 10.
    server.revise_keepalive_count = 10
    adapter = OpcuaAdapter("cdu", settings(server, stale_after_s=0.5, bad_after_s=3.0))
    try:
        await adapter.connect()
        assert not adapter.polling
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:
            for r in await adapter.read():
                assert r.quality is Quality.GOOD, r
            await asyncio.sleep(0.1)
    finally:
        await adapter.close()
    (said,) = _said(caplog, "keep-alive")
    assert "100 ms x 10" in said and "stale after 1.5s" in said


async def test_a_keepalive_slower_than_bad_after_means_polling(
    server: FakeCduServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="adapters.sensors.opcua")
    server.revise_keepalive_count = 50  # 5 s of silence over steady values
    await _polls(server, OpcuaAdapter("cdu", settings(server, stale_after_s=0.5, bad_after_s=3.0)))
    (said,) = _said(caplog, "keep-alive")
    assert "polling" in said


async def test_a_refused_filter_is_dropped_and_the_items_still_subscribed(
    server: FakeCduServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="adapters.sensors.opcua")
    server.refuse_filters = True
    adapter = OpcuaAdapter("cdu", settings(server, deadband=0.5))
    try:
        await adapter.connect()
        assert not adapter.polling
        await server.publish(PUMP_FAILED)
        await read_until(adapter, expected_values(PUMP_FAILED))
        assert adapter.notifications > 0  # the change came by the subscription
        await adapter.connect()
    finally:
        await adapter.close()
    (said,) = _said(caplog, "refused the data-change filter")
    assert "supply_temperature" in said and "subscribed without it" in said
    assert not _said(caplog, "refused monitored items")
