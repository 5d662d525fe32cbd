"""The API's listening socket, with a cap on open connections and a file-descriptor reserve.

Every API connection holds a file descriptor for as long as the client likes;
deliveries, sources and the decision store need theirs too. Past the cap a new
connection gets a 503 and is closed, so no local user can starve deliveries
("Too many open files") by holding connections open.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from typing import cast

from aiohttp import web

log = logging.getLogger(__name__)

# Descriptors kept for everything but the API: sockets to the scheduler and the
# devices, the SQLite files, NVML's device nodes, the journal, the event loop.
FD_RESERVE = 128
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\n"
    b"Content-Type: application/json\r\n"
    b"Retry-After: 10\r\n"
    b"Connection: close\r\n"
    b"Content-Length: 87\r\n\r\n"
    b'{"error":{"code":"too_many_connections","message":"the API is at its connection cap"}}\n'
)
_BUSY_WAIT_S = 2.0  # how long a refused client may take to send its request
# Refused connections waiting for their request; past this many, new ones are
# reset at once (a flood of silent connections must not hold descriptors).
_MAX_REFUSING = 64


class _Refuse(asyncio.Protocol):
    """Answers one request with 503 and closes; never reaches aiohttp."""

    def __init__(self, site: CappedSite) -> None:
        self._site = site

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but behave as one.
        self._transport = cast(asyncio.Transport, transport)
        self._timer: asyncio.TimerHandle | None = None
        if self._site.refusing >= _MAX_REFUSING:
            self._transport.abort()
            return
        self._site.refusing += 1
        # Reply once the request has arrived: closing on unread data would make
        # the kernel send a reset, and the client would never see the 503.
        self._timer = asyncio.get_running_loop().call_later(_BUSY_WAIT_S, self._transport.abort)

    def data_received(self, data: bytes) -> None:
        if self._timer is not None and not self._transport.is_closing():
            self._transport.write(_BUSY)
            self._transport.close()
        self._done()

    def connection_lost(self, exc: Exception | None) -> None:
        self._done()

    def _done(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
            self._site.refusing -= 1


def connection_cap(wanted: int) -> int:
    """``wanted``, raising the soft RLIMIT_NOFILE to fit it and the reserve, else lowered."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = wanted + FD_RESERVE
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as err:
            log.debug("cannot raise RLIMIT_NOFILE to %d: %s", target, err)
    if soft != resource.RLIM_INFINITY and soft < need:
        cap = max(1, soft - FD_RESERVE)
        log.warning(
            "api.max_connections %d lowered to %d: the file limit is %d and %d are kept"
            " for deliveries and sources (raise LimitNOFILE=)",
            wanted,
            cap,
            soft,
            FD_RESERVE,
        )
        return cap
    return wanted


class CappedSite(web.BaseSite):
    """A TCP site that serves at most ``max_connections`` connections at once."""

    __slots__ = ("_accepting", "_host", "_max", "_port", "refused", "refusing")

    def __init__(self, runner: web.BaseRunner, host: str, port: int, max_connections: int) -> None:
        super().__init__(runner)
        self._host = host
        self._port = port
        self._max = max_connections
        self._accepting = 0  # handlers made whose connection_made has not run yet
        self.refused = 0
        self.refusing = 0  # refused connections waiting for their request

    @property
    def name(self) -> str:
        """The site's URL."""
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        """Bind and serve."""
        await super().start()
        server = self._runner.server
        assert server is not None
        loop = asyncio.get_running_loop()

        def settled() -> None:
            self._accepting -= 1

        def protocol() -> asyncio.BaseProtocol:
            # aiohttp counts a connection once its connection_made has run (a
            # callback the transport queues after this one): until then count it here.
            if len(server.connections) + self._accepting >= self._max:
                self.refused += 1
                if self.refused == 1 or self.refused % 1000 == 0:
                    log.warning(
                        "API at its cap of %d connections: refused %d so far",
                        self._max,
                        self.refused,
                    )
                return _Refuse(self)
            self._accepting += 1
            loop.call_soon(loop.call_soon, settled)
            return server()

        self._server = await loop.create_server(
            protocol, self._host, self._port, backlog=self._backlog, reuse_address=True
        )
