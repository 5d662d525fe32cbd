"""A small SNMPv2c agent on UDP loopback with fault controls, and a simulated PDU on it.

``SnmpAgent`` answers GET, GETNEXT and GETBULK from a table of OIDs (or a function that
builds one per request), encoded by pysnmp's own protocol modules, so the adapter under
test speaks real SNMP over a real socket. Faults: ``mode`` "no_answer" (drop every
request), "slow" (answer after ``delay_s``), "garbage" (every value becomes an
OctetString of junk); ``too_big_above`` answers tooBig to any GET with more varbinds.

``SimulatedPdu`` lays a RackSimulator snapshot out as a ServerTech Sentry4 PDU: three
inlet probes (A1..A3 at bottom/middle/top, from RackSnapshot.inlet_c) and per-phase
current, power and voltage (RackSnapshot.pdu_current_a / pdu_power_w), so the shipped
sentry4 profile reads it unchanged.
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Callable, Mapping
from typing import Any, Literal

from pyasn1.codec.ber import decoder, encoder
from pyasn1.error import PyAsn1Error
from pysnmp.proto import api, rfc1902, rfc1905

from fakes.sim import RackSnapshot

OidTuple = tuple[int, ...]
Value = int | float | bytes | str | OidTuple | None
Values = Mapping[OidTuple, Value]
Mode = Literal["ok", "no_answer", "slow", "garbage", "swapped"]

_P = api.PROTOCOL_MODULES[api.SNMP_VERSION_2C]
SYS_DESCR: OidTuple = (1, 3, 6, 1, 2, 1, 1, 1, 0)
SYS_OBJECT_ID: OidTuple = (1, 3, 6, 1, 2, 1, 1, 2, 0)
GARBAGE = b"\xffgarbage\x00"


def oid(text: str) -> OidTuple:
    """'1.3.6.1' as a tuple."""
    return tuple(int(x) for x in text.strip(".").split("."))


def _encode_value(value: Value) -> Any:
    if value is None:
        return rfc1905.NoSuchInstance("")
    if isinstance(value, bool):
        return rfc1902.Integer32(int(value))
    if isinstance(value, int):
        if -(2**31) <= value < 2**31:
            return rfc1902.Integer32(value)
        return rfc1902.Counter64(value)
    if isinstance(value, float):
        return rfc1902.Integer32(round(value))
    if isinstance(value, bytes):
        return rfc1902.OctetString(value)
    if isinstance(value, str):
        return rfc1902.OctetString(value.encode())
    return rfc1902.ObjectIdentifier(value)


class SnmpAgent(asyncio.DatagramProtocol):
    """SNMPv2c agent on 127.0.0.1 (see the module docstring for the fault controls)."""

    def __init__(
        self,
        values: Values | Callable[[], Values],
        *,
        community: bytes = b"public",
    ) -> None:
        self._values = values
        self.community = community
        self.mode: Mode = "ok"
        self.delay_s = 0.0
        self.too_big_above: int | None = None
        self.requests = 0
        self.varbinds_per_request: list[int] = []
        self._transport: asyncio.DatagramTransport | None = None
        self._pending: set[asyncio.Task[None]] = set()
        self.port = 0

    async def start(self, port: int = 0) -> None:
        """Bind to 127.0.0.1:port (0 picks a free port, see .port)."""
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(
            lambda: self, local_addr=("127.0.0.1", port)
        )
        self._transport = transport
        self.port = transport.get_extra_info("sockname")[1]

    async def stop(self) -> None:
        """Close the socket and cancel delayed answers."""
        for task in list(self._pending):
            task.cancel()
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)
        if self._transport is not None:
            self._transport.close()
            self._transport = None

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        """Answer one request (or not, per the fault mode)."""
        self.requests += 1
        if self.mode == "no_answer":
            return
        try:
            answer = self._answer(data)
        except PyAsn1Error:
            return  # not SNMP: real agents drop it too
        if answer is None:
            return
        if self.mode == "slow" and self.delay_s > 0:
            task = asyncio.get_running_loop().create_task(self._later(answer, addr))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)
            return
        if self._transport is not None:
            self._transport.sendto(answer, addr)

    async def _later(self, answer: bytes, addr: tuple[str | Any, int]) -> None:
        await asyncio.sleep(self.delay_s)
        if self._transport is not None:
            self._transport.sendto(answer, addr)

    def _table(self) -> tuple[list[OidTuple], Values]:
        values = self._values() if callable(self._values) else self._values
        return sorted(values), values

    def _answer(self, data: bytes) -> bytes | None:
        msg, _ = decoder.decode(data, asn1Spec=_P.Message())
        if bytes(_P.apiMessage.get_community(msg)) != self.community:
            return None  # v2c agents stay silent on a wrong community
        req = _P.apiMessage.get_pdu(msg)
        rsp = _P.apiPDU.get_response(req)
        _P.apiPDU.set_error_status(rsp, 0)
        _P.apiPDU.set_error_index(rsp, 0)
        names = [tuple(o) for o, _ in _P.apiPDU.get_varbinds(req)]
        self.varbinds_per_request.append(len(names))
        order, values = self._table()
        out: list[tuple[OidTuple, Any]]
        if req.isSameTypeWith(_P.GetRequestPDU()):
            if self.too_big_above is not None and len(names) > self.too_big_above:
                _P.apiPDU.set_error_status(rsp, 1)  # tooBig
                out = [(n, rfc1902.Null("")) for n in names]
            else:
                out = [(n, self._get(values, n)) for n in names]
                if self.mode == "swapped" and len(out) > 1:
                    # A firmware bug seen on PDUs: the first two varbinds come back
                    # in each other's place.
                    out[0], out[1] = out[1], out[0]
        elif req.isSameTypeWith(_P.GetNextRequestPDU()):
            out = [self._next(order, values, n) for n in names]
        elif req.isSameTypeWith(_P.GetBulkRequestPDU()):
            reps = int(_P.apiBulkPDU.get_max_repetitions(req))
            out = []
            for n in names:
                cur = n
                for _ in range(max(1, reps)):
                    cur, val = self._next(order, values, cur)
                    out.append((cur, val))
                    if isinstance(val, rfc1905.EndOfMibView):
                        break
        else:
            _P.apiPDU.set_error_status(rsp, 5)  # genErr: SETs are not served
            out = [(n, rfc1902.Null("")) for n in names]
        _P.apiPDU.set_varbinds(rsp, [(rfc1902.ObjectName(n), v) for n, v in out])
        _P.apiMessage.set_pdu(msg, rsp)
        return bytes(encoder.encode(msg))

    def _get(self, values: Values, name: OidTuple) -> Any:
        if name not in values:
            return rfc1905.NoSuchInstance("")
        if self.mode == "garbage" and name not in (SYS_OBJECT_ID, SYS_DESCR):
            return rfc1902.OctetString(GARBAGE)
        return _encode_value(values[name])

    def _next(self, order: list[OidTuple], values: Values, name: OidTuple) -> tuple[OidTuple, Any]:
        i = bisect.bisect_right(order, name)
        if i >= len(order):
            return name, rfc1905.EndOfMibView("")
        found = order[i]
        return found, self._get(values, found)


# --- a Sentry4-shaped PDU driven by the simulator --------------------------------------

_S4 = "1.3.6.1.4.1.1718.4.1"
PROBE_IDS = ("A1", "A2", "A3")


def sentry4_values(snap: RackSnapshot) -> dict[OidTuple, Value]:
    """A Sentry4 PDU's OIDs for one simulator snapshot (see the module docstring)."""
    v: dict[OidTuple, Value] = {
        SYS_DESCR: b"Sentry Smart PDU (rackguard simulated)",
        SYS_OBJECT_ID: oid("1.3.6.1.4.1.1718.4"),
        oid(f"{_S4}.3.2.1.2.1.1"): b"AA",
        oid(f"{_S4}.3.2.1.3.1.1"): b"Master_Cord_A",
        oid(f"{_S4}.3.3.1.3.1.1"): round(sum(snap.pdu_power_w.values())),
        oid(f"{_S4}.9.1.10.0"): 0,  # st4TempSensorScale: celsius
    }
    for i, phase in enumerate(sorted(snap.pdu_power_w), start=1):
        v[oid(f"{_S4}.5.2.1.4.1.1.{i}")] = phase.encode()
        v[oid(f"{_S4}.5.3.1.3.1.1.{i}")] = 2300  # tenths of V
        v[oid(f"{_S4}.5.3.1.6.1.1.{i}")] = round(snap.pdu_current_a[phase] * 100)
        v[oid(f"{_S4}.5.3.1.8.1.1.{i}")] = round(snap.pdu_power_w[phase])
    for i, (probe_id, label) in enumerate(zip(PROBE_IDS, snap.inlet_c, strict=False), start=1):
        v[oid(f"{_S4}.9.2.1.2.1.{i}")] = probe_id.encode()
        v[oid(f"{_S4}.9.2.1.3.1.{i}")] = f"Inlet_{label}".encode()
        v[oid(f"{_S4}.9.3.1.1.1.{i}")] = round(snap.inlet_c[label] * 10)
    return v


class SimulatedPdu(SnmpAgent):
    """A Sentry4-shaped PDU whose values follow the simulator's latest snapshot."""

    def __init__(
        self, snapshot: Callable[[], RackSnapshot], *, community: bytes = b"public"
    ) -> None:
        super().__init__(lambda: sentry4_values(snapshot()), community=community)
        first = snapshot()
        # For the source's config: probe id -> the simulator's height label.
        self.probe_positions: dict[str, str] = dict(zip(PROBE_IDS, first.inlet_c, strict=False))
