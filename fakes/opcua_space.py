"""OPC UA's standard address space, filled once per process for every fake server.

asyncua fills the standard address space (about 6,200 nodes) at every ``Server.init()``:
1.2-1.6 s of CPU, paid again by every test and simulator that starts a fake CDU. Its own
remedy, ``init(shelf_file)``, keeps the filled nodes in a dbm shelf on disk and copies a
node out only when it is first touched; but which dbm a Python has decides the shelf's
file name, and asyncua finds only gdbm's and ndbm's (pyenv's Python has neither). This
does the same from memory: the first server of a process fills a pristine space, and
every server copies a node from it the first time it touches that node. No two servers
share a node object, so one server's writes (its namespace array, its status) are
never another's.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, MutableMapping
from pathlib import Path

from asyncua import ua
from asyncua.server.address_space import NodeData
from asyncua.server.internal_server import InternalServer
from asyncua.server.server import Server

_PRISTINE: list[dict[ua.NodeId, NodeData]] = []  # the process's one pristine space


class _CopiedOnTouch(MutableMapping[ua.NodeId, NodeData]):
    """A server's nodes: its own, and the pristine standard ones copied when first read."""

    def __init__(self, source: dict[ua.NodeId, NodeData]) -> None:
        self._source = source
        self._own: dict[ua.NodeId, NodeData] = {}
        self._deleted: set[ua.NodeId] = set()

    def __getitem__(self, key: ua.NodeId) -> NodeData:
        try:
            return self._own[key]
        except KeyError:
            if key in self._deleted:
                raise
            node = self._own[key] = copy.deepcopy(self._source[key])
            return node

    def __setitem__(self, key: ua.NodeId, value: NodeData) -> None:
        self._own[key] = value
        self._deleted.discard(key)

    def __delitem__(self, key: ua.NodeId) -> None:
        if key not in self:
            raise KeyError(key)
        self._own.pop(key, None)
        if key in self._source:
            self._deleted.add(key)

    def __contains__(self, key: object) -> bool:
        return key in self._own or (key in self._source and key not in self._deleted)

    def __iter__(self) -> Iterator[ua.NodeId]:
        yield from self._own
        yield from (k for k in self._source if k not in self._own and k not in self._deleted)

    def __len__(self) -> int:
        return sum(1 for _ in self)


async def _pristine() -> dict[ua.NodeId, NodeData]:
    if not _PRISTINE:
        filler = InternalServer()
        await InternalServer.load_standard_address_space(filler)
        _PRISTINE.append(filler.aspace._nodes)
    return _PRISTINE[0]


async def init_server(server: Server) -> None:
    """``server.init()``, its standard address space copied from the process's pristine one."""
    iserver = server.iserver

    async def load_standard_address_space(shelf_file: Path | None = None) -> None:
        # AddressSpace keeps its nodes in ``_nodes``; asyncua's shelf mode swaps it the same way.
        iserver.aspace._nodes = _CopiedOnTouch(await _pristine())  # type: ignore[assignment]

    iserver.load_standard_address_space = load_standard_address_space  # type: ignore[method-assign]
    await server.init()
