"""The server's OperationLimits (OPC-UA Part 5 6.3.11), and service calls split to fit them.

A server states how many operations one request may carry in
Server/ServerCapabilities/OperationLimits; a PLC's embedded server may allow only a
handful, and answers a bigger request with BadTooManyOperations (Part 4 7.34). An
absent limit, 0 or a Bad status means "no limit". A server that refuses a chunk it
stated it would take (or states nothing and still refuses) gets the chunk halved
until it is accepted, said once in the log; a refusal of a single operation is an
error naming the service and the count.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from asyncua import ua
from asyncua.client.client import Client
from asyncua.ua.attribute_ids import AttributeIds
from asyncua.ua.object_ids import ObjectIds
from asyncua.ua.status_codes import StatusCodes
from asyncua.ua.uaerrors import UaStatusCodeError

from adapters.errors import SourceUnavailable

log = logging.getLogger(__name__)

Service = Literal["Read", "TranslateBrowsePathsToNodeIds", "CreateMonitoredItems"]

# Each service we call with many operations, and the OperationLimits property that bounds it.
LIMIT_NODES: dict[Service, tuple[str, int]] = {
    "Read": (
        "MaxNodesPerRead",
        ObjectIds.Server_ServerCapabilities_OperationLimits_MaxNodesPerRead,
    ),
    "TranslateBrowsePathsToNodeIds": (
        "MaxNodesPerTranslateBrowsePathsToNodeIds",
        ObjectIds.Server_ServerCapabilities_OperationLimits_MaxNodesPerTranslateBrowsePathsToNodeIds,
    ),
    "CreateMonitoredItems": (
        "MaxMonitoredItemsPerCall",
        ObjectIds.Server_ServerCapabilities_OperationLimits_MaxMonitoredItemsPerCall,
    ),
}

T = TypeVar("T")
R = TypeVar("R")


@dataclass(slots=True)
class OperationLimits:
    """Operations per request for each service; 0 = no limit. Learnt limits replace stated ones."""

    stated: dict[Service, int] = field(default_factory=dict)
    learnt: dict[Service, int] = field(default_factory=dict)
    requests: int = 0  # service requests sent through call() (for stats and benches)

    def limit(self, service: Service) -> int:
        return self.learnt.get(service) or self.stated.get(service, 0)

    async def call(
        self,
        service: Service,
        url: str,
        items: Sequence[T],
        send: Callable[[list[T]], Awaitable[Sequence[R]]],
    ) -> list[R]:
        """``send`` over ``items`` in chunks within the limit, results in the items' order."""
        out: list[R] = []
        start = 0
        while start < len(items):
            size = self.limit(service) or len(items)
            chunk = list(items[start : start + size])
            self.requests += 1
            try:
                results = await send(chunk)
            except UaStatusCodeError as err:
                if err.code != StatusCodes.BadTooManyOperations:
                    raise
                self._shrink(service, url, len(chunk))
                continue
            if len(results) != len(chunk):
                raise SourceUnavailable(
                    f"{url}: {service} of {len(chunk)} operations answered {len(results)} results"
                )
            out.extend(results)
            start += len(chunk)
        return out

    def _shrink(self, service: Service, url: str, refused: int) -> None:
        name = LIMIT_NODES[service][0]
        if refused <= 1:
            raise SourceUnavailable(
                f"{url}: {service} of 1 operation refused (BadTooManyOperations);"
                f" the server takes none ({name} {self.stated.get(service) or 'not stated'})"
            )
        smaller = math.ceil(refused / 2)
        log.warning(
            "%s answered BadTooManyOperations to a %s of %d operations (%s %s);"
            " sending at most %d per request",
            url,
            service,
            refused,
            name,
            self.stated.get(service) or "not stated",
            smaller,
        )
        self.learnt[service] = smaller


async def read_operation_limits(client: Client) -> OperationLimits:
    """The limits the server states for the services we call; unreadable ones are no limit."""
    services = list(LIMIT_NODES)
    nodes = [
        ua.ReadValueId(
            NodeId=ua.NodeId(ua.Int32(LIMIT_NODES[s][1])), AttributeId=AttributeIds.Value
        )
        for s in services
    ]
    limits = OperationLimits()
    try:
        values = await client.uaclient.read(ua.ReadParameters(NodesToRead=nodes))
    except UaStatusCodeError as err:
        # A server that takes fewer than three nodes per Read (or no such Read): try one by one.
        if err.code != StatusCodes.BadTooManyOperations:
            return limits
        values = []
        for node in nodes:
            values.extend(await client.uaclient.read(ua.ReadParameters(NodesToRead=[node])))
        refused = True
    else:
        refused = False
    for service, dv in zip(services, values, strict=False):
        limits.stated[service] = _count(dv)
    if refused:  # it refused len(nodes), whatever it states
        limits.learnt["Read"] = min(limits.stated.get("Read") or len(nodes) - 1, len(nodes) - 1)
    return limits


def _count(dv: ua.DataValue) -> int:
    """A stated limit as a positive int; 0 (no limit) for Bad, empty or non-integer values."""
    if dv.StatusCode is not None and not dv.StatusCode.is_good():
        return 0
    value = dv.Value.Value if dv.Value is not None else None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return 0
    return value
