"""SNMP GET and GETBULK on pysnmp's asyncio engines, in its fast modes.

SNMPv2c goes through pysnmp's v1arch dispatcher and SNMPv3 through its v3arch engine.
Both skip the high-level API's MIB resolution: requests are PDUs of numeric OIDs built
once and reused (only the request id changes), responses come back as raw varbinds.
See FIELD-NOTES (MIB lookups cost 2-3x) and bench/snmp_cost.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pysnmp.entity.rfc3413 import cmdgen
from pysnmp.hlapi.v1arch.asyncio import CommunityData as V1CommunityData
from pysnmp.hlapi.v1arch.asyncio import SnmpDispatcher
from pysnmp.hlapi.v1arch.asyncio import UdpTransportTarget as V1UdpTarget
from pysnmp.hlapi.v3arch.asyncio import (
    SnmpEngine,
    UdpTransportTarget,
    UsmUserData,
    usmAesBlumenthalCfb192Protocol,
    usmAesBlumenthalCfb256Protocol,
    usmAesCfb128Protocol,
    usmAesCfb192Protocol,
    usmAesCfb256Protocol,
    usmHMAC128SHA224AuthProtocol,
    usmHMAC192SHA256AuthProtocol,
    usmHMAC256SHA384AuthProtocol,
    usmHMAC384SHA512AuthProtocol,
    usmHMACSHAAuthProtocol,
    usmNoPrivProtocol,
)
from pysnmp.hlapi.v3arch.asyncio.lcd import CommandGeneratorLcdConfigurator
from pysnmp.proto import errind, rfc1902, rfc1905
from pysnmp.proto.api import v2c

from adapters.errors import SourceAuthError, SourceSetupError, SourceUnavailable
from adapters.sensors.snmp_scaling import Missing, RawValue

OidTuple = tuple[int, ...]

AUTH_PROTOCOLS: dict[str, Any] = {
    "sha": usmHMACSHAAuthProtocol,
    "sha224": usmHMAC128SHA224AuthProtocol,
    "sha256": usmHMAC192SHA256AuthProtocol,
    "sha384": usmHMAC256SHA384AuthProtocol,
    "sha512": usmHMAC384SHA512AuthProtocol,
}
# aes192/aes256 use the key extension net-snmp and most PDUs use (Blumenthal draft);
# aes192c/aes256c the Reeder one (Cisco's "AES-192/256-C").
PRIV_PROTOCOLS: dict[str, Any] = {
    "none": usmNoPrivProtocol,
    "aes": usmAesCfb128Protocol,
    "aes128": usmAesCfb128Protocol,
    "aes192": usmAesBlumenthalCfb192Protocol,
    "aes256": usmAesBlumenthalCfb256Protocol,
    "aes192c": usmAesCfb192Protocol,
    "aes256c": usmAesCfb256Protocol,
}

# Agent answers that mean the credentials are wrong (v3 reports).
_AUTH_ERRORS: tuple[type[errind.ErrorIndication], ...] = (
    errind.UnknownUserName,
    errind.WrongDigest,
    errind.AuthenticationError,
    errind.AuthenticationFailure,
    errind.UnsupportedSecurityLevel,
    errind.UnknownSecurityName,
    errind.DecryptionError,
    errind.NotInTimeWindow,
    errind.UnknownEngineID,
)

_TOO_BIG = 1
_NO_SUCH = {
    rfc1905.NoSuchObject.tagSet: "noSuchObject",
    rfc1905.NoSuchInstance.tagSet: "noSuchInstance",
    rfc1905.EndOfMibView.tagSet: "endOfMibView",
}
_INT_TAGS = frozenset(
    t.tagSet
    for t in (
        rfc1902.Integer,
        rfc1902.Integer32,
        rfc1902.Gauge32,
        rfc1902.Counter32,
        rfc1902.Counter64,
        rfc1902.Unsigned32,
        rfc1902.TimeTicks,
    )
)
_OCTETS_TAGS = frozenset({rfc1902.OctetString.tagSet, rfc1902.IpAddress.tagSet})
_NULL = rfc1902.Null("")


class TooBig(Exception):
    """The agent answered tooBig: the request must be split."""


def decode(value: Any) -> RawValue:
    """A response value as int, bytes or Missing (with the SNMP exception's name)."""
    if isinstance(value, Missing):
        return value
    tag = value.tagSet
    if tag in _INT_TAGS:
        return int(value)
    if tag in _OCTETS_TAGS:
        return value.asOctets()  # type: ignore[no-any-return]
    name = _NO_SUCH.get(tag)
    if name is not None:
        return Missing(name)
    return Missing(f"wrong type: {type(value).__name__}")


def text(value: Any) -> str:
    """A response value as text (for names, units and scale fields)."""
    if isinstance(value, Missing):
        return ""
    tag = value.tagSet
    if tag in _OCTETS_TAGS:
        raw: bytes = value.asOctets()
        return raw.decode("utf-8", "replace")
    if tag in _INT_TAGS:
        return str(int(value))
    if tag in _NO_SUCH:
        return ""
    return str(value.prettyPrint())


def oid_text(value: Any) -> str:
    """An OBJECT IDENTIFIER value as dotted text; "" for anything else."""
    if isinstance(value, Missing) or value.tagSet != rfc1902.ObjectIdentifier.tagSet:
        return ""
    return str(value)


@dataclass(slots=True)
class Prepared:
    """A request PDU built once and reused; oids in request order."""

    oids: tuple[OidTuple, ...]
    pdu: Any


def in_request_order(request: Prepared, varbinds: Any) -> list[Any]:
    """The response values, each checked against the OID asked for in its position.

    An agent that answers another OID there (a firmware bug seen on PDUs) must
    not have its value recorded under the wrong sensor: that one is Missing.
    """
    out: list[Any] = []
    for i, (name, value) in enumerate(varbinds):
        got = tuple(name)
        asked = request.oids[i] if i < len(request.oids) else None
        if asked is not None and got != asked:
            wanted = ".".join(map(str, asked))
            out.append(Missing(f"agent answered {'.'.join(map(str, got))} for {wanted}"))
        else:
            out.append(value)
    return out


@dataclass(frozen=True, slots=True)
class V3Credentials:
    """SNMPv3 USM user; keys already read from their secret files."""

    user: str
    auth_protocol: str
    auth_key: bytes
    priv_protocol: str = "none"
    priv_key: bytes = b""

    @property
    def level(self) -> str:
        """authPriv or authNoPriv."""
        return "authNoPriv" if self.priv_protocol == "none" else "authPriv"


class SnmpClient(Protocol):
    """What the adapter needs from an SNMP session."""

    target: str

    async def open(self) -> None:
        """Resolve the target and open the UDP socket."""

    def prepare_get(self, oids: Sequence[OidTuple]) -> Prepared:
        """A GET request for these OIDs, to send many times."""

    async def get(self, request: Prepared) -> list[Any]:
        """The response values in request order; raises TooBig or a SourceError."""

    async def bulk(self, oid: OidTuple, max_repetitions: int) -> list[tuple[OidTuple, Any]]:
        """One GETBULK (no non-repeaters) starting after oid."""

    async def close(self) -> None:
        """Release the socket and timers; never raises."""

    async def why_silent(self) -> str:
        """After a timeout: the likely reasons, for an operator (says what it can test)."""


async def _resolve(host: str, port: int) -> None:
    """SourceSetupError naming the host when it does not resolve (not pysnmp's internals)."""
    try:
        await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except (socket.gaierror, UnicodeError) as err:
        reason = err.strerror if isinstance(err, socket.gaierror) else str(err)
        raise SourceSetupError(f"host {host!r} cannot be resolved: {reason}") from err


class _Refusal(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.refused = asyncio.get_running_loop().create_future()

    def error_received(self, exc: Exception) -> None:
        if not self.refused.done():
            self.refused.set_result(isinstance(exc, ConnectionRefusedError))


async def port_refuses(host: str, port: int, wait_s: float = 0.3) -> bool:
    """True when the host answers a datagram to this port with ICMP port unreachable.

    A connected UDP socket sees that as ECONNREFUSED; silence (a firewall, a wrong
    community) proves nothing, so False means "unknown", not "open".
    """
    loop = asyncio.get_running_loop()
    try:
        transport, protocol = await loop.create_datagram_endpoint(
            _Refusal, remote_addr=(host, port)
        )
    except OSError:
        return False
    try:
        transport.sendto(b"\x30\x00")  # an empty SEQUENCE: any agent drops it
        async with asyncio.timeout(wait_s):
            return bool(await protocol.refused)
    except TimeoutError:
        return False
    finally:
        transport.close()


def _silence(target: str, refused: bool, causes: str) -> str:
    if refused:
        return (
            f"nothing answers on {target} (ICMP port unreachable): a wrong host or port,"
            " or no SNMP agent running there"
        )
    return f"{target} does not answer: {causes}"


def _request_id(pdu: Any) -> None:
    v2c.apiPDU.set_request_id(pdu, v2c.getNextRequestID())


def _prepare(oids: Sequence[OidTuple]) -> Prepared:
    pdu = v2c.GetRequestPDU()
    v2c.apiPDU.set_defaults(pdu)
    v2c.apiPDU.set_varbinds(pdu, [(rfc1902.ObjectName(o), _NULL) for o in oids])
    return Prepared(tuple(oids), pdu)


def _bulk_pdu(oid: OidTuple, max_repetitions: int) -> Any:
    pdu = v2c.GetBulkRequestPDU()
    v2c.apiBulkPDU.set_defaults(pdu)
    v2c.apiBulkPDU.set_non_repeaters(pdu, 0)
    v2c.apiBulkPDU.set_max_repetitions(pdu, max_repetitions)
    v2c.apiBulkPDU.set_varbinds(pdu, [(rfc1902.ObjectName(oid), _NULL)])
    return pdu


def _check_status(target: str, status: Any, index: Any, n: int) -> None:
    code = int(status)
    if code == 0:
        return
    if code == _TOO_BIG:
        raise TooBig
    name = status.prettyPrint() if hasattr(status, "prettyPrint") else str(code)
    raise SourceUnavailable(f"{target}: agent answered {name} (error index {int(index)} of {n})")


class V2cClient:
    """SNMPv2c over pysnmp's v1arch dispatcher (the cheaper engine for community auth)."""

    def __init__(
        self, host: str, port: int, community: bytes, *, timeout_s: float, retries: int
    ) -> None:
        self.target = f"{host}:{port}"
        self._address = (host, port)
        self._auth = V1CommunityData(community.decode("utf-8", "replace"), mpModel=1)
        self._timeout_s = timeout_s
        self._retries = retries
        self._dispatcher: SnmpDispatcher | None = None
        self._transport: Any = None

    async def open(self) -> None:
        """Resolve the address and start the dispatcher."""
        await self.close()
        await _resolve(*self._address)
        try:
            self._transport = await V1UdpTarget.create(
                self._address, timeout=self._timeout_s, retries=self._retries
            )
        except Exception as err:  # pysnmp wraps resolver errors in PySnmpError
            raise SourceSetupError(f"{self.target}: cannot resolve the address: {err}") from err
        self._dispatcher = SnmpDispatcher()

    def prepare_get(self, oids: Sequence[OidTuple]) -> Prepared:
        """A GET PDU for these OIDs."""
        return _prepare(oids)

    async def _send(self, pdu: Any) -> Any:
        dispatcher = self._dispatcher
        if dispatcher is None:
            raise SourceUnavailable(f"{self.target}: not open")
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        def done(_d: Any, _handle: Any, error: Any, response: Any, _ctx: Any) -> None:
            if future.done():
                return
            if error is not None:
                future.set_exception(_unavailable(self.target, error, self._timeout_s))
            else:
                future.set_result(response)

        _request_id(pdu)
        dispatcher.send_pdu(self._auth, self._transport, pdu, cbFun=done)
        return await future

    async def get(self, request: Prepared) -> list[Any]:
        """One GET; values in request order."""
        response = await self._send(request.pdu)
        _check_status(
            self.target,
            v2c.apiPDU.get_error_status(response),
            v2c.apiPDU.get_error_index(response, muteErrors=True),
            len(request.oids),
        )
        return in_request_order(request, v2c.apiPDU.get_varbinds(response))

    async def bulk(self, oid: OidTuple, max_repetitions: int) -> list[tuple[OidTuple, Any]]:
        """One GETBULK."""
        response = await self._send(_bulk_pdu(oid, max_repetitions))
        _check_status(
            self.target,
            v2c.apiBulkPDU.get_error_status(response),
            v2c.apiBulkPDU.get_error_index(response, muteErrors=True),
            1,
        )
        return [(tuple(name), value) for name, value in v2c.apiBulkPDU.get_varbinds(response)]

    async def why_silent(self) -> str:
        """A wrong community and a dead port look alike to SNMP; ICMP tells them apart."""
        refused = await port_refuses(*self._address)
        return _silence(
            self.target,
            refused,
            "a wrong community (agents silently drop requests with a community they do not"
            " know), an agent ACL that does not admit this host, a firewall, or the device"
            " is down; check with `snmpget -v2c -c COMMUNITY HOST 1.3.6.1.2.1.1.2.0`",
        )

    async def close(self) -> None:
        """Stop the dispatcher and wait for its timer task to end."""
        dispatcher, self._dispatcher = self._dispatcher, None
        if dispatcher is None:
            return
        timer = dispatcher.transport_dispatcher.loopingcall
        with contextlib.suppress(Exception):
            dispatcher.close()
        if timer is not None:
            # wait() raises nothing of the timer's; a stop that arrives meanwhile goes on
            # (swallowed here, its caller would carry on as if never asked to stop).
            await asyncio.wait([timer], timeout=1.0)


class V3Client:
    """SNMPv3 (USM) over pysnmp's v3arch engine, one engine per device."""

    def __init__(
        self,
        host: str,
        port: int,
        creds: V3Credentials,
        *,
        timeout_s: float,
        retries: int,
    ) -> None:
        self.target = f"{host}:{port}"
        self._address = (host, port)
        self._creds = creds
        self._timeout_s = timeout_s
        self._retries = retries
        self._engine: SnmpEngine | None = None
        self._addr_name: Any = None
        self._generator = cmdgen.CommandGenerator()

    async def open(self) -> None:
        """Start the engine and register the user and target."""
        await self.close()
        await _resolve(*self._address)
        c = self._creds
        try:
            transport = await UdpTransportTarget.create(
                self._address, timeout=self._timeout_s, retries=self._retries
            )
        except Exception as err:
            raise SourceSetupError(f"{self.target}: cannot resolve the address: {err}") from err
        user = UsmUserData(
            c.user,
            authKey=c.auth_key.decode("utf-8"),
            privKey=c.priv_key.decode("utf-8") if c.priv_key else None,
            authProtocol=AUTH_PROTOCOLS[c.auth_protocol],
            privProtocol=PRIV_PROTOCOLS[c.priv_protocol],
        )
        engine = SnmpEngine()
        self._addr_name, _ = CommandGeneratorLcdConfigurator().configure(
            engine, user, transport, ""
        )
        self._engine = engine

    def prepare_get(self, oids: Sequence[OidTuple]) -> Prepared:
        """A GET PDU for these OIDs."""
        return _prepare(oids)

    async def _send(self, pdu: Any, n: int) -> list[tuple[Any, Any]]:
        engine = self._engine
        if engine is None:
            raise SourceUnavailable(f"{self.target}: not open")
        future: asyncio.Future[list[tuple[Any, Any]]] = asyncio.get_running_loop().create_future()

        def done(_engine: Any, _handle: Any, error: Any, response: Any, _ctx: Any) -> None:
            if future.done():
                return
            try:
                if error:
                    raise self._error(error)
                _check_status(
                    self.target,
                    v2c.apiPDU.get_error_status(response),
                    v2c.apiPDU.get_error_index(response, muteErrors=True),
                    n,
                )
                future.set_result(list(v2c.apiPDU.get_varbinds(response)))
            except Exception as err:  # handed to the awaiting poll, never lost in pysnmp
                future.set_exception(err)

        _request_id(pdu)
        self._generator.send_pdu(engine, self._addr_name, None, "", pdu, done, None)
        return await future

    def _error(self, error: Any) -> Exception:
        user = self._creds.user
        if isinstance(error, _AUTH_ERRORS):
            return SourceAuthError(
                f"{self.target}: SNMPv3 user {user!r} refused: {error}"
                f" ({type(error).__name__}: wrong user name, key or engine id)"
            )
        if isinstance(error, errind.RequestTimedOut) and self._creds.priv_protocol != "none":
            return SourceUnavailable(
                f"{self.target}: no answer within {self._timeout_s:g}s (timeout — or a wrong"
                f" privacy key for SNMPv3 user {user!r}: agents drop what they cannot decrypt)"
            )
        return _unavailable(self.target, error, self._timeout_s)

    async def get(self, request: Prepared) -> list[Any]:
        """One GET; values in request order."""
        vbs = await self._send(request.pdu, len(request.oids))
        return in_request_order(request, vbs)

    async def bulk(self, oid: OidTuple, max_repetitions: int) -> list[tuple[OidTuple, Any]]:
        """One GETBULK."""
        vbs = await self._send(_bulk_pdu(oid, max_repetitions), 1)
        return [(tuple(name), value) for name, value in vbs]

    async def why_silent(self) -> str:
        """The likely reasons an SNMPv3 agent stays silent."""
        refused = await port_refuses(*self._address)
        priv = (
            f"a wrong privacy key ({self._creds.priv_protocol}: agents drop what they cannot"
            " decrypt), "
            if self._creds.priv_protocol != "none"
            else ""
        )
        return _silence(
            self.target,
            refused,
            f"{priv}an agent ACL or view that does not admit user {self._creds.user!r} from"
            " this host, a firewall, or the device is down; check user, auth_key_file and"
            " priv_key_file with `snmpget -v3 -l authPriv -u USER -a SHA -A KEY -x AES -X KEY"
            " HOST 1.3.6.1.2.1.1.2.0`",
        )

    async def close(self) -> None:
        """Stop the engine's dispatcher and wait for its timer task to end."""
        engine, self._engine = self._engine, None
        if engine is None:
            return
        dispatcher = engine.transport_dispatcher
        timer = getattr(dispatcher, "loopingcall", None) if dispatcher is not None else None
        with contextlib.suppress(Exception):
            engine.close_dispatcher()
        if timer is not None:
            # wait() raises nothing of the timer's; a stop that arrives meanwhile goes on
            # (swallowed here, its caller would carry on as if never asked to stop).
            await asyncio.wait([timer], timeout=1.0)


def _unavailable(target: str, error: Any, timeout_s: float) -> SourceUnavailable:
    if isinstance(error, errind.RequestTimedOut):
        return SourceUnavailable(f"{target}: no answer within {timeout_s:g}s (timeout)")
    return SourceUnavailable(f"{target}: {error}")
