"""An SNMP agent on pysnmp's own engine: v2c communities and v3 USM users on one UDP port.

The values come from a function called per request (the simulator's latest
snapshot laid out in a vendor MIB). pysnmp's command responders do the protocol
(GET, GETNEXT, GETBULK; USM authentication and privacy; VACM), so a daemon's
SNMPv3 session is checked by a real engine, not by our own parsing.

Fault controls, as on the v2c test agent (fakes/snmp_agent.py): ``mode``
"no_answer" (requests are dropped), "slow" (each request is handled ``delay_s``
later), "garbage" (every value but sysDescr/sysObjectID is junk bytes).
"""

from __future__ import annotations

import asyncio
import bisect
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pysnmp.carrier.asyncio.dgram import udp
from pysnmp.entity import config, engine
from pysnmp.entity.rfc3413 import cmdrsp, context
from pysnmp.proto import rfc1902, rfc1905
from pysnmp.smi import instrum

from fakes.snmp_agent import GARBAGE, SYS_DESCR, SYS_OBJECT_ID, OidTuple, Value, _encode_value

Mode = Literal["ok", "no_answer", "slow", "garbage"]
AUTH = {"sha": config.USM_AUTH_HMAC96_SHA, "sha256": config.USM_AUTH_HMAC192_SHA256}
PRIV = {"none": config.USM_PRIV_NONE, "aes": config.USM_PRIV_CFB128_AES}


@dataclass(frozen=True, slots=True)
class V3User:
    """One USM user; ``priv_key`` empty means authNoPriv."""

    name: str
    auth_key: str
    priv_key: str = ""
    auth_protocol: str = "sha"
    priv_protocol: str = "aes"


class _Values(instrum.AbstractMibInstrumController):  # type: ignore[misc]
    """Answers reads from the agent's current value table."""

    def __init__(self, agent: EngineAgent) -> None:
        self._agent = agent

    def _encode(self, name: OidTuple, value: Value) -> Any:
        if self._agent.mode == "garbage" and name not in (SYS_OBJECT_ID, SYS_DESCR):
            return rfc1902.OctetString(GARBAGE)
        return _encode_value(value)

    def read_variables(self, *var_binds: Any, **_context: Any) -> list[tuple[Any, Any]]:
        values = self._agent.table()
        out = []
        for name, _ in var_binds:
            key = tuple(name)
            if key in values:
                out.append((name, self._encode(key, values[key])))
            else:
                out.append((name, rfc1905.NoSuchInstance("")))
        return out

    def read_next_variables(self, *var_binds: Any, **_context: Any) -> list[tuple[Any, Any]]:
        values = self._agent.table()
        order = sorted(values)
        out = []
        for name, _ in var_binds:
            i = bisect.bisect_right(order, tuple(name))
            if i >= len(order):
                out.append((name, rfc1905.EndOfMibView("")))
            else:
                found = order[i]
                out.append((rfc1902.ObjectName(found), self._encode(found, values[found])))
        return out


class _FaultyTransport(udp.UdpAsyncioTransport):  # type: ignore[misc]
    """The engine's UDP transport, with the agent's drop and delay faults in front of it."""

    def __init__(self, agent: EngineAgent) -> None:
        super().__init__()
        self._agent = agent

    def datagram_received(self, datagram: bytes, address: Any) -> None:
        self._agent.requests += 1
        if self._agent.mode == "no_answer":
            return
        if self._agent.mode == "slow" and self._agent.delay_s > 0:
            handle = self.loop.call_later(self._agent.delay_s, self._late, datagram, address)
            self._agent.delayed.add(handle)
            return
        super().datagram_received(datagram, address)

    def _late(self, datagram: bytes, address: Any) -> None:
        now = self.loop.time()
        self._agent.delayed = {h for h in self._agent.delayed if h.when() > now}
        super().datagram_received(datagram, address)


class EngineAgent:
    """An SNMP v2c + v3 agent on ``host:port`` serving ``values()``; start() then stop()."""

    def __init__(
        self,
        values: Callable[[], dict[OidTuple, Value]],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        community: str = "public",
        users: tuple[V3User, ...] = (),
    ) -> None:
        self._values = values
        self.host = host
        self.port = port
        self.community = community
        self.users = users
        self.mode: Mode = "ok"
        self.delay_s = 0.0
        self.requests = 0
        self.delayed: set[asyncio.TimerHandle] = set()  # slow answers not handled yet
        self._engine: engine.SnmpEngine | None = None
        self._transport: _FaultyTransport | None = None

    def table(self) -> dict[OidTuple, Value]:
        """The values served now."""
        return self._values()

    async def start(self) -> None:
        """Bind the socket and register the responders."""
        if ":" in self.host:
            raise ValueError(f"pdu: {self.host!r}: the simulated PDU listens on IPv4 only")
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            sock.bind((self.host, self.port))
        except OSError:
            sock.close()
            raise
        self.port = sock.getsockname()[1]
        snmp = engine.SnmpEngine()
        transport = _FaultyTransport(self)
        transport.open_server_mode(sock=sock)
        await transport._lport  # the endpoint exists once this is done
        config.add_transport(snmp, udp.DOMAIN_NAME, transport)
        if self.community:
            config.add_v1_system(snmp, "rackguard-sim", self.community)
            config.add_vacm_user(snmp, 2, "rackguard-sim", "noAuthNoPriv", (1, 3, 6))
        for user in self.users:
            priv = user.priv_protocol if user.priv_key else "none"
            config.add_v3_user(
                snmp,
                user.name,
                AUTH[user.auth_protocol],
                user.auth_key,
                PRIV[priv],
                user.priv_key or None,
            )
            level = "authPriv" if priv != "none" else "authNoPriv"
            config.add_vacm_user(snmp, 3, user.name, level, (1, 3, 6))
        ctx = context.SnmpContext(snmp)
        ctx.unregister_context_name(b"")  # the engine's own MIB tree: serve ours instead
        ctx.register_context_name(b"", _Values(self))
        cmdrsp.GetCommandResponder(snmp, ctx)
        cmdrsp.NextCommandResponder(snmp, ctx)
        cmdrsp.BulkCommandResponder(snmp, ctx)
        self._engine, self._transport = snmp, transport

    async def stop(self) -> None:
        """Close the socket."""
        for handle in self.delayed:
            handle.cancel()
        self.delayed.clear()
        snmp, self._engine = self._engine, None
        if snmp is not None:
            snmp.close_dispatcher()
        self._transport = None
