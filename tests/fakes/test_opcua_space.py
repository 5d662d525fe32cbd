"""Fake OPC UA servers of one process copy the standard address space; none shares a node."""

from __future__ import annotations

import pytest
from asyncua import ua
from asyncua.client.client import Client
from asyncua.ua.attribute_ids import AttributeIds
from asyncua.ua.object_ids import ObjectIds

from fakes.cdu_server import FakeCduServer
from fakes.opcua_space import _CopiedOnTouch, _pristine

PRODUCT_NAME = ua.NodeId(ua.Int32(ObjectIds.Server_ServerStatus_BuildInfo_ProductName))
NAMESPACES = ua.NodeId(ua.Int32(ObjectIds.Server_NamespaceArray))


async def test_two_servers_in_one_process_write_their_own_standard_nodes() -> None:
    first, second = FakeCduServer(model="generic"), FakeCduServer(model="generic")
    await first.start()
    await second.start()
    try:
        assert first._server is not None and second._server is not None
        # Each copied what it touched, not the ~6,200 nodes asyncua fills.
        for server in (first._server, second._server):
            nodes = server.iserver.aspace._nodes
            assert isinstance(nodes, _CopiedOnTouch)
            assert 0 < len(nodes._own) < len(await _pristine()) / 10
        await first._server.get_node(PRODUCT_NAME).write_value("first")
        await second._server.get_node(PRODUCT_NAME).write_value("second")
        for fake, name in ((first, "first"), (second, "second")):
            async with Client(fake.url, timeout=5) as client:
                assert await client.get_node(PRODUCT_NAME).read_value() == name
                spaces = await client.get_node(NAMESPACES).read_value()
                assert "urn:rackguard:cdu" in spaces
    finally:
        await first.stop()
        await second.stop()
    # What they wrote stayed theirs: the pristine space is as asyncua fills it.
    pristine = await _pristine()
    value = pristine[PRODUCT_NAME].attributes[AttributeIds.Value].value
    assert value is not None and value.Value is not None
    assert value.Value.Value not in ("first", "second")


async def test_a_deleted_standard_node_is_gone_from_that_server_only() -> None:
    pristine = await _pristine()
    mine, theirs = _CopiedOnTouch(pristine), _CopiedOnTouch(pristine)
    assert PRODUCT_NAME in mine and len(mine) == len(pristine)
    del mine[PRODUCT_NAME]
    assert PRODUCT_NAME not in mine and PRODUCT_NAME not in set(mine)
    assert len(mine) == len(pristine) - 1
    assert PRODUCT_NAME in theirs and theirs[PRODUCT_NAME] is not pristine[PRODUCT_NAME]
    with pytest.raises(KeyError):
        mine[PRODUCT_NAME]
    mine[PRODUCT_NAME] = theirs[PRODUCT_NAME]  # added again (AddNodes after DeleteNodes)
    assert mine[PRODUCT_NAME] is theirs[PRODUCT_NAME]
