"""A small etcd v3 client over etcd's JSON gateway (``/v3/...``), on the aiohttp we already use.

Why the gateway and not a gRPC client: it is part of every etcd since 3.4 (same
port, same TLS), it needs no new dependency (grpcio is a large C extension with
threads of its own), and the few calls rackguard makes -- lease grant /
keepalive / revoke, range, put, delete, txn, watch -- map one to one onto JSON
POSTs. Keys and values travel base64-encoded; 64-bit integers as strings.

Every call has a timeout; a connection failure tries the next endpoint. An
unreachable cluster raises :class:`EtcdUnavailable` (the caller degrades), an
answer etcd gives but rejects raises :class:`EtcdError`.

Production etcd: TLS (an ``ssl`` context with the cluster's CA and, for
``--client-cert-auth``, our certificate) and etcd's own authentication (user
and password: ``/v3/auth/authenticate`` gives a token sent in the
``Authorization`` header, fetched again when etcd says it expired).
"""

from __future__ import annotations

import base64
import logging
import ssl
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

log = logging.getLogger(__name__)


class EtcdError(Exception):
    """etcd answered, but refused the request (a bad lease, a malformed txn, ...)."""


class EtcdUnavailable(EtcdError):
    """No endpoint answered in time: the caller falls back, it does not wait."""


def b64(text: str | bytes) -> str:
    """Key or value as the gateway wants it."""
    raw = text.encode() if isinstance(text, str) else text
    return base64.b64encode(raw).decode()


def unb64(text: str) -> bytes:
    """Key or value as the gateway sends it."""
    return base64.b64decode(text)


def prefix_end(prefix: str) -> str:
    """The ``range_end`` that selects every key starting with ``prefix`` (base64)."""
    raw = bytearray(prefix.encode())
    raw[-1] += 1  # our prefixes end in '/', never 0xff
    return base64.b64encode(bytes(raw)).decode()


@dataclass(frozen=True, slots=True)
class Kv:
    """One key as etcd holds it."""

    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int

    @classmethod
    def from_json(cls, kv: object) -> Kv:
        """From a gateway ``kvs`` entry; EtcdError when it is not one."""
        try:
            assert isinstance(kv, Mapping)
            return cls(
                unb64(str(kv.get("key", ""))).decode(errors="replace"),
                unb64(str(kv.get("value", ""))),
                int(kv.get("create_revision", 0)),
                int(kv.get("mod_revision", 0)),
                int(kv.get("lease", 0)),
            )
        except (AssertionError, ValueError, TypeError) as err:  # binascii.Error is a ValueError
            raise EtcdError(f"not an etcd key-value: {str(kv)[:200]}") from err


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """A put or delete seen by a watch."""

    kind: str  # "PUT" or "DELETE"
    kv: Kv


# Builders for txn operations and comparisons, as the gateway spells them.
def absent(key: str) -> dict[str, Any]:
    """Compare: the key does not exist."""
    return {"key": b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}


def put_op(key: str, value: str | bytes, lease: int = 0) -> dict[str, Any]:
    """Txn op: put."""
    body: dict[str, Any] = {"key": b64(key), "value": b64(value)}
    if lease:
        body["lease"] = str(lease)
    return {"request_put": body}


def delete_op(key: str, *, prefix: bool = False) -> dict[str, Any]:
    """Txn op: delete a key (or every key under a prefix)."""
    body = {"key": b64(key)}
    if prefix:
        body["range_end"] = prefix_end(key)
    return {"request_delete_range": body}


def range_op(prefix: str) -> dict[str, Any]:
    """Txn op: read every key under a prefix."""
    return {"request_range": {"key": b64(prefix), "range_end": prefix_end(prefix)}}


def get_op(key: str) -> dict[str, Any]:
    """Txn op: read one key."""
    return {"request_range": {"key": b64(key)}}


def ranges(responses: Sequence[object]) -> list[list[Kv]]:
    """The keys each of a txn's range ops read, in order (EtcdError when one is not a key)."""
    out = []
    for r in responses:
        ranged = r.get("response_range") if isinstance(r, dict) else None
        kvs = ranged.get("kvs") or [] if isinstance(ranged, dict) else []
        out.append([Kv.from_json(kv) for kv in kvs])
    return out


class _TokenRefused(EtcdError):
    """etcd wants a (new) auth token."""


# What etcd 3.4's gateway says when the token is missing, expired or unknown.
_TOKEN_ERRORS = ("invalid auth token", "user name is empty", "auth token is not found")


class EtcdClient:
    """The calls rackguard makes, each one POST to the first endpoint that answers."""

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        timeout_s: float = 1.0,
        tls: ssl.SSLContext | None = None,
        user: str = "",
        password: str = "",
    ) -> None:
        if not endpoints:
            raise ValueError("no etcd endpoints")
        self.endpoints = [e.rstrip("/") for e in endpoints]
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self._current = 0  # the endpoint that answered last
        self._tls = tls
        self.user = user
        self._password = password
        self._token = ""
        self.answered: Callable[[str], None] | None = None  # told of every good answer (path)

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(ssl=self._tls) if self._tls is not None else None
            self._session = aiohttp.ClientSession(timeout=self._timeout, connector=connector)
        return self._session

    def _headers(self) -> dict[str, str]:
        return {"Authorization": self._token} if self._token else {}

    async def call(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """One request (authenticated first when a user is set); the next endpoint on a failure."""
        if self.user and not self._token:
            await self._authenticate()
        try:
            out = await self._call(path, body)
        except _TokenRefused:
            if not self.user:
                raise EtcdError(
                    f"etcd requires authentication ({path}); set etcd_user and etcd_password_file"
                ) from None
            await self._authenticate()  # the token expired (etcd's auth-token-ttl): once more
            out = await self._call(path, body)
        if self.answered is not None:
            self.answered(path)
        return out

    async def _authenticate(self) -> None:
        self._token = ""
        try:
            body = await self._call(
                "/v3/auth/authenticate", {"name": self.user, "password": self._password}
            )
        except _TokenRefused as err:
            raise EtcdError(f"etcd authentication as {self.user!r} failed: {err}") from None
        token = body.get("token")
        if not isinstance(token, str) or not token:
            raise EtcdError(f"etcd authentication as {self.user!r} gave no token")
        self._token = token

    async def _call(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        data = orjson.dumps(body)
        last = ""
        for i in range(len(self.endpoints)):
            n = (self._current + i) % len(self.endpoints)
            url = self.endpoints[n] + path
            try:
                async with self._http().post(url, data=data, headers=self._headers()) as resp:
                    raw = await resp.read()
                    status = resp.status
            except (aiohttp.ClientError, TimeoutError, OSError) as err:
                last = f"{url}: {type(err).__name__}: {err}"
                continue
            if status >= 500 and status != 501:
                last = f"{url}: HTTP {status}: {raw[:200]!r}"
                continue
            self._current = n
            try:
                parsed = orjson.loads(raw) if raw else {}
            except orjson.JSONDecodeError as err:
                if b"CommonName" in raw:
                    # etcd 3.4: with auth on, its gateway refuses a client certificate
                    # that has a CN (it would not be the identity used).
                    raise EtcdError(
                        f"{url}: etcd refuses a client certificate with a CommonName on its"
                        " JSON gateway while authentication is on: issue rackguard's"
                        " certificate without a CN and authenticate with etcd_user"
                    ) from err
                raise EtcdError(f"{url}: not JSON: {raw[:200]!r}") from err
            if isinstance(parsed, dict) and "header" not in parsed:
                said = str(parsed.get("error") or parsed.get("message") or "")
                if any(e in said for e in _TOKEN_ERRORS):
                    raise _TokenRefused(f"{url}: {said}")
                if "authentication failed" in said:
                    raise EtcdError(f"{url}: {said} (user {self.user!r})")
            if status != 200 or not isinstance(parsed, dict):
                raise EtcdError(f"{url}: HTTP {status}: {str(parsed)[:200]}")
            if "error" in parsed and "header" not in parsed:
                raise EtcdError(f"{url}: {parsed.get('error') or parsed.get('message')}")
            return parsed
        raise EtcdUnavailable(f"etcd unreachable ({last})")

    async def grant(self, ttl_s: int) -> int:
        """A new lease of ``ttl_s`` seconds; its ID."""
        body = await self.call("/v3/lease/grant", {"TTL": str(ttl_s)})
        try:
            return int(body["ID"])
        except (KeyError, ValueError, TypeError) as err:
            raise EtcdError(f"lease grant: no ID in {str(body)[:200]}") from err

    async def keepalive(self, lease: int) -> int:
        """Refresh a lease once; its remaining TTL (0 or less: it has expired)."""
        body = await self.call("/v3/lease/keepalive", {"ID": str(lease)})
        result = body.get("result", body)
        try:
            return int(result.get("TTL", 0))
        except (AttributeError, ValueError, TypeError) as err:
            raise EtcdError(f"lease keepalive: {str(body)[:200]}") from err

    async def revoke(self, lease: int) -> None:
        """End a lease now: every key bound to it goes."""
        await self.call("/v3/lease/revoke", {"ID": str(lease)})

    async def get_prefix(self, prefix: str) -> tuple[list[Kv], int]:
        """Every key under ``prefix``, and the revision it was read at."""
        body = await self.call(
            "/v3/kv/range", {"key": b64(prefix), "range_end": prefix_end(prefix)}
        )
        return [Kv.from_json(kv) for kv in body.get("kvs") or []], _revision(body)

    async def put(self, key: str, value: str | bytes, lease: int = 0) -> int:
        """Write a key; the new revision."""
        body = await self.call("/v3/kv/put", put_op(key, value, lease)["request_put"])
        return _revision(body)

    async def delete(self, key: str, *, prefix: bool = False) -> None:
        """Delete a key or every key under a prefix."""
        await self.call("/v3/kv/deleterange", delete_op(key, prefix=prefix)["request_delete_range"])

    async def txn(
        self,
        compare: Sequence[Mapping[str, Any]],
        success: Sequence[Mapping[str, Any]],
        failure: Sequence[Mapping[str, Any]] = (),
    ) -> tuple[bool, list[dict[str, Any]]]:
        """The success ops if every comparison holds, else the failure ops; (ok, responses)."""
        body = await self.call(
            "/v3/kv/txn",
            {"compare": list(compare), "success": list(success), "failure": list(failure)},
        )
        return bool(body.get("succeeded", False)), list(body.get("responses") or [])

    async def get_ranges(self, spans: Sequence[tuple[str, str]]) -> tuple[list[Kv], int]:
        """Every key in each ``[start, end)`` span, read at one revision; and that revision."""
        ops = [{"request_range": {"key": b64(a), "range_end": b64(b)}} for a, b in spans]
        body = await self.call("/v3/kv/txn", {"compare": [], "success": ops, "failure": []})
        kvs = [kv for span in ranges(body.get("responses") or []) for kv in span]
        return kvs, _revision(body)

    async def watch(
        self, prefix: str, start_revision: int, *, end: str | None = None
    ) -> AsyncIterator[WatchEvent]:
        """Events under ``prefix`` (or in ``[prefix, end)``) from ``start_revision`` on.

        Raises EtcdUnavailable when it cannot be opened or breaks (the caller
        reads the prefix afresh and watches again).
        """
        req = {
            "create_request": {
                "key": b64(prefix),
                "range_end": prefix_end(prefix) if end is None else b64(end),
                "start_revision": str(start_revision),
            }
        }
        if self.user and not self._token:
            await self._authenticate()
        url = self.endpoints[self._current] + "/v3/watch"
        # No total timeout: a watch stays open; a dead server shows as a read error.
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self._timeout.total)
        try:
            async with self._http().post(
                url, data=orjson.dumps(req), timeout=timeout, headers=self._headers()
            ) as resp:
                if resp.status != 200:
                    raise EtcdUnavailable(f"{url}: HTTP {resp.status}")
                async for line in resp.content:
                    if not line.strip():
                        continue
                    msg = orjson.loads(line)
                    result = msg.get("result", {}) if isinstance(msg, dict) else {}
                    if not isinstance(result, dict):
                        raise EtcdError(f"{url}: watch sent {str(msg)[:200]}")
                    if not result and isinstance(msg, dict) and msg.get("error"):
                        self._token = ""  # a refused token: the reconnect authenticates again
                        raise EtcdUnavailable(f"{url}: watch refused: {str(msg)[:200]}")
                    if result.get("canceled") or result.get("compact_revision"):
                        raise EtcdUnavailable(
                            f"{url}: watch cancelled ({result.get('cancel_reason', 'compacted')})"
                        )
                    for ev in result.get("events") or []:
                        yield WatchEvent(str(ev.get("type", "PUT")), Kv.from_json(ev.get("kv", {})))
        except (aiohttp.ClientError, TimeoutError, OSError, orjson.JSONDecodeError) as err:
            self._current = (self._current + 1) % len(self.endpoints)
            raise EtcdUnavailable(f"{url}: watch broke: {type(err).__name__}: {err}") from err
        raise EtcdUnavailable(f"{url}: watch stream ended")

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None


def _revision(body: Mapping[str, Any]) -> int:
    header = body.get("header") or {}
    try:
        return int(header.get("revision", 0))
    except (AttributeError, ValueError, TypeError) as err:
        raise EtcdError(f"no revision in {str(body)[:200]}") from err
