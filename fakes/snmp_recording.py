"""Recordings of real devices (.snmprec) served by snmpsim on UDP loopback, with faults.

``SnmpsimServer`` runs snmpsim's command responder in a child process; each recording
is served under the community named after its file stem. ``garbage=True`` serves a
copy whose numeric values are replaced by junk strings. ``UdpFaultProxy`` sits in
front of any UDP agent (snmpsim, snmpd) and can drop or delay what passes.

As root, snmpsim must drop to nobody/nogroup; a Python under root's home directory is
then unreadable for lazy imports (dbm, codecs), so this module, run as a program,
imports them before handing over to snmpsim (FIELD-NOTES).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from pyasn1.codec.ber import decoder, encoder
from pysnmp.proto import api, rfc1902

from fakes.processes import stop_process

_P = api.PROTOCOL_MODULES[api.SNMP_VERSION_2C]
_NUMERIC_TYPES = {"2", "65", "66", "67", "70"}
_KEEP = ("1.3.6.1.2.1.1.",)  # system group stays intact so the device is still identified


def free_udp_port() -> int:
    """A UDP port free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def get_request(community: str, oid: str, request_id: int = 1) -> bytes:
    """The bytes of an SNMPv2c GET of one OID."""
    pdu = _P.GetRequestPDU()
    _P.apiPDU.set_defaults(pdu)
    _P.apiPDU.set_request_id(pdu, request_id)
    _P.apiPDU.set_varbinds(pdu, [(rfc1902.ObjectName(oid), rfc1902.Null(""))])
    msg = _P.Message()
    _P.apiMessage.set_defaults(msg)
    _P.apiMessage.set_community(msg, community)
    _P.apiMessage.set_pdu(msg, pdu)
    return bytes(encoder.encode(msg))


def snmp_get_blocking(port: int, community: str, oid: str, timeout_s: float = 0.5) -> Any:
    """One blocking v2c GET against 127.0.0.1:port; the value, or None on no answer."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(timeout_s)
        s.sendto(get_request(community, oid), ("127.0.0.1", port))
        try:
            data = s.recv(65535)
        except TimeoutError:
            return None
    msg, _ = decoder.decode(data, asn1Spec=_P.Message())
    ((_, value),) = _P.apiPDU.get_varbinds(_P.apiMessage.get_pdu(msg))
    return value


def _garbled(text: str) -> str:
    out = []
    for line in text.splitlines():
        parts = line.split("|", 2)
        if len(parts) == 3 and parts[1] in _NUMERIC_TYPES and not parts[0].startswith(_KEEP):
            out.append(f"{parts[0]}|4|garbage-{parts[2]}!")
        else:
            out.append(line)
    return "\n".join(out) + "\n"


class SnmpsimServer:
    """snmpsim serving recordings on 127.0.0.1:port (blocking start/stop, for fixtures)."""

    def __init__(self, recordings: Iterable[Path], *, garbage: bool = False) -> None:
        self.recordings = list(recordings)
        self.garbage = garbage
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: Path | None = None

    def start(self, timeout_s: float = 60.0) -> None:
        """Copy the recordings, start snmpsim and wait until every recording answers."""
        self._dir = Path(tempfile.mkdtemp(prefix="rg-snmpsim-"))
        self._dir.chmod(0o755)
        data = self._dir / "data"
        cache = self._dir / "cache"
        data.mkdir(mode=0o755)
        cache.mkdir(mode=0o755)
        for rec in self.recordings:
            text = rec.read_text(encoding="utf-8", errors="surrogateescape")
            out = data / rec.name
            out.write_text(_garbled(text) if self.garbage else text, errors="surrogateescape")
            out.chmod(0o644)
        self.port = free_udp_port()
        args = [
            sys.executable,
            "-m",
            "fakes.snmp_recording",
            f"--data-dir={data}",
            f"--cache-dir={cache}",
            f"--agent-udpv4-endpoint=127.0.0.1:{self.port}",
            "--log-level=error",
        ]
        if os.geteuid() == 0:
            shutil.chown(cache, "nobody", "nogroup")
            args += ["--process-user=nobody", "--process-group=nogroup"]
        root = Path(__file__).resolve().parent.parent
        env = {**os.environ, "PYTHONPATH": str(root)}
        # A log file, not a pipe: a full pipe would block the responder.
        log_path = self._dir / "snmpsim.log"
        with log_path.open("wb") as log:
            self._proc = subprocess.Popen(
                args, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + timeout_s
        pending = [r.stem for r in self.recordings]
        while pending:
            code = self._proc.poll()
            if code is not None:
                output = log_path.read_text(errors="replace")
                self.stop()
                raise RuntimeError(f"snmpsim exited ({code}): {output[-2000:]}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"snmpsim did not answer within {timeout_s}s for {pending}")
            if snmp_get_blocking(self.port, pending[0], "1.3.6.1.2.1.1.2.0") is not None:
                pending.pop(0)

    def stop(self) -> None:
        """Stop snmpsim and remove the copies."""
        proc, self._proc = self._proc, None
        stop_process(proc)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


class UdpFaultProxy(asyncio.DatagramProtocol):
    """Forwards datagrams between clients and a UDP agent; mode "no_answer" or "slow" faults."""

    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self.mode: Literal["ok", "no_answer", "slow"] = "ok"
        self.delay_s = 0.0
        self.port = 0
        self._transport: asyncio.DatagramTransport | None = None
        self._upstream: dict[tuple[Any, ...], asyncio.DatagramTransport] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Listen on a free loopback port (see .port)."""
        transport, _ = await asyncio.get_running_loop().create_datagram_endpoint(
            lambda: self, local_addr=("127.0.0.1", 0)
        )
        self._transport = transport
        self.port = transport.get_extra_info("sockname")[1]

    async def stop(self) -> None:
        """Close every socket and cancel delayed forwards."""
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for up in self._upstream.values():
            up.close()
        self._upstream.clear()
        if self._transport is not None:
            self._transport.close()
            self._transport = None

    def datagram_received(self, data: bytes, addr: tuple[Any, ...]) -> None:
        """A client's request: forward it (or not)."""
        if self.mode == "no_answer":
            return
        task = asyncio.get_running_loop().create_task(self._forward(data, addr))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _forward(self, data: bytes, client: tuple[Any, ...]) -> None:
        if self.mode == "slow":
            await asyncio.sleep(self.delay_s)
        up = self._upstream.get(client)
        if up is None:
            proxy = self

            class _Back(asyncio.DatagramProtocol):
                def datagram_received(self, reply: bytes, _addr: tuple[Any, ...]) -> None:
                    if proxy._transport is not None and proxy.mode != "no_answer":
                        proxy._transport.sendto(reply, client)

            up, _ = await asyncio.get_running_loop().create_datagram_endpoint(
                _Back, remote_addr=self.target
            )
            self._upstream[client] = up
        up.sendto(data)


def _run_snmpsim() -> int:
    """snmpsim's responder, after importing what a dropped-privilege process cannot."""
    import codecs  # noqa: PLC0415
    import dbm.dumb  # noqa: F401, PLC0415

    for encoding in ("latin-1", "ascii", "utf-8", "idna"):
        codecs.lookup(encoding)
    from snmpsim.commands.responder import main  # noqa: PLC0415

    result: int = main()
    return result


if __name__ == "__main__":
    sys.exit(_run_snmpsim())
