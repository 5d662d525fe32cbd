"""OperationLimits for a fake asyncua server: stated in the address space, and enforced.

asyncua's server states no OperationLimits and takes any number of operations per
request. A PLC's embedded server does not: it answers a request with more operations
than it allows with the service result BadTooManyOperations (OPC-UA Part 4 7.34).
:func:`limit_operations` makes an asyncua server behave so, and counts the requests
each client session sends per service, so tests and benches can see the cost.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from asyncua import ua
from asyncua.common.utils import ServiceError
from asyncua.server.internal_session import InternalSession
from asyncua.server.server import Server
from asyncua.ua.object_ids import ObjectIds
from asyncua.ua.status_codes import StatusCodes

_LIMITS = "Server_ServerCapabilities_OperationLimits_"


@dataclass(slots=True)
class OperationLimits:
    """Operations allowed per request (0 = any); ``stated`` False enforces them unannounced."""

    read: int = 0
    translate: int = 0
    monitored_items: int = 0
    stated: bool = True
    requests: Counter[str] = field(default_factory=Counter)  # service -> requests from clients
    refused: Counter[str] = field(default_factory=Counter)  # service -> BadTooManyOperations


def _check(limits: OperationLimits, service: str, limit: int, items: Sequence[Any]) -> None:
    limits.requests[service] += 1
    if limit and len(items) > limit:
        limits.refused[service] += 1
        raise ServiceError(StatusCodes.BadTooManyOperations)


def _guard(session: InternalSession, limits: OperationLimits) -> None:
    read, translate = session.read, session.translate_browsepaths_to_nodeids
    create = session.create_monitored_items

    async def guarded_read(params: ua.ReadParameters) -> list[ua.DataValue]:
        _check(limits, "Read", limits.read, params.NodesToRead)
        return await read(params)

    async def guarded_translate(paths: list[ua.BrowsePath]) -> list[ua.BrowsePathResult]:
        _check(limits, "TranslateBrowsePathsToNodeIds", limits.translate, paths)
        return await translate(paths)

    async def guarded_create(
        params: ua.CreateMonitoredItemsParameters,
    ) -> list[ua.MonitoredItemCreateResult]:
        _check(limits, "CreateMonitoredItems", limits.monitored_items, params.ItemsToCreate)
        return await create(params)

    session.read = guarded_read  # type: ignore[method-assign]
    session.translate_browsepaths_to_nodeids = guarded_translate  # type: ignore[method-assign,assignment]
    session.create_monitored_items = guarded_create  # type: ignore[method-assign]


async def limit_operations(server: Server, limits: OperationLimits) -> None:
    """State (unless ``limits.stated`` is False) and enforce ``limits`` on client sessions."""
    stated = limits.stated
    for name, value in (
        ("MaxNodesPerRead", limits.read),
        ("MaxNodesPerTranslateBrowsePathsToNodeIds", limits.translate),
        ("MaxMonitoredItemsPerCall", limits.monitored_items),
    ):
        node = ua.NodeId(ua.Int32(getattr(ObjectIds, _LIMITS + name)))
        await server.write_attribute_value(
            node, ua.DataValue(ua.Variant(value if stated else 0, ua.VariantType.UInt32))
        )
    iserver = server.iserver
    create_session: Callable[..., InternalSession] = iserver.create_session

    def guarded_session(*args: Any, **kwargs: Any) -> InternalSession:
        session = create_session(*args, **kwargs)
        if session.external:
            _guard(session, limits)
        return session

    iserver.create_session = guarded_session  # type: ignore[method-assign]
