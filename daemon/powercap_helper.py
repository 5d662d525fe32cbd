"""The privileged power-cap helper: the one root process that may change a GPU's limit.

Socket-activated (systemd/rackguard-powercap.socket) and run as
``rackguard powercap-helper``. It answers one JSON line per connection:

* ``{"op": "limits"}`` -> ``{"ok": true, "limits": [GpuLimit, ...]}``
* ``{"op": "set", "uuid": "GPU-...", "watts": 350}`` -> ``{"ok": true, "limit": GpuLimit}``
* anything refused -> ``{"ok": false, "error": "...", "permanent": true|false}``

Only a peer whose SO_PEERCRED uid resolves to ``allowed_user`` (the daemon's
DynamicUser ``rackguard``) is served. A limit must be finite and within
[NVML minimum, the GPU's default]; the GPU must be one of this host's. Each change
is logged (peer, GPU, from, to). With no connection for ``idle_exit_s`` it exits;
systemd starts it again on the next one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pwd
import socket
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from adapters.sensors.power_limit import (
    DirectNvmlLimiter,
    PowerLimiter,
    PowerLimitError,
    check_request,
    find_gpu,
)

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 1024  # {"op":"set","uuid":"GPU-<36>","watts":...} is under 100 bytes
SD_LISTEN_FDS_START = 3
DYNAMIC_UIDS = Path("/run/systemd/dynamic-uid")
_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


@dataclass(frozen=True, slots=True)
class Peer:
    """Who is on the other end, as the kernel says (SO_PEERCRED at connect time)."""

    pid: int
    uid: int
    gid: int

    def users(self, dynamic_uids: Path = DYNAMIC_UIDS) -> set[str]:
        """The names of the peer's uid: /etc/passwd's, and systemd's DynamicUser's.

        A DynamicUser is in no passwd file; systemd records it as the symlink
        ``direct:<uid> -> <name>`` under /run/systemd/dynamic-uid (what nss-systemd
        reads), which only systemd can write. Read directly, it needs no NSS module.
        """
        names: set[str] = set()
        with contextlib.suppress(KeyError):
            names.add(pwd.getpwuid(self.uid).pw_name)
        with contextlib.suppress(OSError):
            names.add(os.readlink(dynamic_uids / f"direct:{self.uid}"))
        return names


def peer_of(sock: socket.socket) -> Peer:
    """The kernel's credentials of a Unix-socket peer."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    return Peer(*_UCRED.unpack(raw))


class Refused(Exception):
    """A request the helper will not carry out; permanent unless said otherwise."""

    def __init__(self, message: str, *, permanent: bool = True) -> None:
        super().__init__(message)
        self.permanent = permanent


class PowerCapHelper:
    """Serves limit requests from one user over a listening Unix socket."""

    def __init__(
        self,
        limiter: PowerLimiter,
        *,
        allowed_user: str,
        idle_exit_s: float | None = 30.0,
        read_timeout_s: float = 5.0,
        nvml_timeout_s: float = 8.0,
        dynamic_uids: Path = DYNAMIC_UIDS,
    ) -> None:
        self.nvml_timeout_s = nvml_timeout_s
        self.dynamic_uids = dynamic_uids
        self._limiter = limiter
        self.allowed_user = allowed_user
        self.idle_exit_s = idle_exit_s
        self.read_timeout_s = read_timeout_s
        self._lock = asyncio.Lock()  # one NVML request at a time
        self._active = 0
        self._activity = asyncio.Event()

    async def serve(self, sock: socket.socket) -> None:
        """Serve on a listening socket until idle for idle_exit_s (forever when None)."""
        server = await asyncio.start_unix_server(
            self._connection, sock=sock, limit=MAX_REQUEST_BYTES
        )
        async with server:
            while True:
                self._activity.clear()
                try:
                    async with asyncio.timeout(self.idle_exit_s):
                        await self._activity.wait()
                except TimeoutError:
                    if self._active == 0:
                        log.info("power-cap helper idle for %g s: exiting", self.idle_exit_s)
                        return

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._active += 1
        self._activity.set()
        try:
            reply = await self._answer(reader, writer)
            writer.write(orjson.dumps(reply) + b"\n")
            await writer.drain()
        except (ConnectionError, TimeoutError):
            pass  # the peer left; nothing to answer
        finally:
            self._active -= 1
            self._activity.set()
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _answer(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> dict[str, Any]:
        sock = writer.get_extra_info("socket")
        peer = peer_of(sock)
        users = peer.users(self.dynamic_uids)
        if self.allowed_user not in users:
            log.warning(
                "refused connection from uid %d (%s) pid %d: only %s may ask",
                peer.uid,
                ", ".join(sorted(users)) or "no user name",
                peer.pid,
                self.allowed_user,
            )
            return _refusal(Refused(f"uid {peer.uid} may not use this socket"))
        try:
            request = await self._request(reader)
            async with self._lock:
                try:
                    async with asyncio.timeout(self.nvml_timeout_s):
                        return await self._carry_out(request, peer)
                except TimeoutError as err:
                    # The call is abandoned on NVML's thread; later ones fail at once
                    # (busy) until it returns, and never queue behind it.
                    raise Refused(
                        f"NVML did not answer within {self.nvml_timeout_s:g} s", permanent=False
                    ) from err
        except Refused as err:
            log.warning("refused request from pid %d: %s", peer.pid, err)
            return _refusal(err)
        except PowerLimitError as err:
            log.warning("request from pid %d failed: %s", peer.pid, err)
            return _refusal(Refused(str(err), permanent=err.permanent))

    async def _request(self, reader: asyncio.StreamReader) -> dict[str, Any]:
        """One bounded JSON line, decoded to an object."""
        try:
            async with asyncio.timeout(self.read_timeout_s):
                line = await reader.readuntil(b"\n")
        except asyncio.LimitOverrunError as err:
            raise Refused(f"request longer than {MAX_REQUEST_BYTES} bytes") from err
        except asyncio.IncompleteReadError as err:
            raise Refused("request is not one newline-terminated line") from err
        except TimeoutError as err:
            raise Refused(f"no request line within {self.read_timeout_s:g} s") from err
        if len(line) > MAX_REQUEST_BYTES:
            raise Refused(f"request longer than {MAX_REQUEST_BYTES} bytes")
        try:
            request = orjson.loads(line)
        except orjson.JSONDecodeError as err:
            raise Refused(f"request is not JSON: {err}") from err
        if not isinstance(request, dict):
            raise Refused("request must be a JSON object")
        return request

    async def _carry_out(self, request: dict[str, Any], peer: Peer) -> dict[str, Any]:
        op = request.get("op")
        if op == "limits" and request.keys() == {"op"}:
            return {"ok": True, "limits": [g.to_json() for g in await self._limiter.limits()]}
        if op == "set" and request.keys() == {"op", "uuid", "watts"}:
            uuid, watts = request["uuid"], request["watts"]
            if not isinstance(uuid, str):
                raise Refused("uuid must be a string")
            before = find_gpu(await self._limiter.limits(), uuid)
            w = check_request(before, watts)
            after = await self._limiter.set_limit(uuid, w)
            log.info(
                "uid %d pid %d set GPU %d (%s) power limit %g W -> %g W (enforced %g W)",
                peer.uid,
                peer.pid,
                after.index,
                uuid,
                before.requested_w,
                after.requested_w,
                after.enforced_w,
            )
            return {"ok": True, "limit": after.to_json()}
        if op in ("limits", "set"):
            raise Refused(f"op {op!r} takes exactly: {_FIELDS[op]}")
        raise Refused(f"unknown op {str(op)[:40]!r}: only 'limits' and 'set'")


_FIELDS = {"limits": "op", "set": "op, uuid, watts"}


def _refusal(err: Refused) -> dict[str, Any]:
    return {"ok": False, "error": str(err), "permanent": err.permanent}


def activated_socket() -> socket.socket:
    """The listening socket systemd passed (LISTEN_FDS); OSError without one."""
    if os.environ.get("LISTEN_PID") != str(os.getpid()) or os.environ.get("LISTEN_FDS") != "1":
        raise OSError(
            "no socket from systemd (LISTEN_FDS): start this through"
            " rackguard-powercap.socket, or pass --socket PATH"
        )
    for name in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        os.environ.pop(name, None)
    return socket.socket(fileno=SD_LISTEN_FDS_START)


def bound_socket(path: str) -> socket.socket:
    """A listening Unix socket at ``path`` (mode 0600) for running without systemd."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(path)
    finally:
        os.umask(old)
    sock.listen(16)
    return sock


async def run_helper(
    binding: Any, *, allowed_user: str, idle_exit_s: float | None, socket_path: str | None
) -> int:
    """Serve on systemd's socket (or ``socket_path``) with NVML through ``binding``."""
    try:
        sock = bound_socket(socket_path) if socket_path else activated_socket()
    except OSError as err:
        print(f"rackguard powercap-helper: {err}", file=sys.stderr)
        return 1
    limiter = DirectNvmlLimiter(binding, name="powercap-helper")
    helper = PowerCapHelper(limiter, allowed_user=allowed_user, idle_exit_s=idle_exit_s)
    try:
        await helper.serve(sock)
    finally:
        await limiter.close()
        sock.close()
    return 0
