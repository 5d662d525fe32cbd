"""One Kubernetes API client: where the server is, its credentials, one session.

The sink (node cordon and taint), the pods' notices and evictions, and the
steering label all go through the same KubeClient: one session, one token
reader, one timeout.
"""

from __future__ import annotations

import contextlib
import os
import ssl
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import orjson

from adapters.base import DeliveryError, http_error
from adapters.schedulers.bounded import read_error_body

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
JSON_PATCH = "application/json-patch+json"


class KubeAuthError(Exception):
    """No usable API server address or credentials."""


@dataclass(frozen=True, slots=True)
class KubeConnection:
    """Where the API server is and how to authenticate to it."""

    api_url: str
    token: Callable[[], str]  # called per request: mounted tokens rotate
    ssl: ssl.SSLContext | bool


def _file_token(path: Path) -> Callable[[], str]:
    def read() -> str:
        try:
            return path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as err:
            raise KubeAuthError(f"cannot read token file {str(path)!r}: {err}") from err

    return read


def _ssl(
    ca_file: Path | None, insecure: bool, ca_data: bytes | None = None
) -> ssl.SSLContext | bool:
    if insecure:
        return False
    if ca_file is None and ca_data is None:
        return True
    try:
        ctx = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
        if ca_data is not None:
            ctx.load_verify_locations(cadata=ca_data.decode())
    except (OSError, ssl.SSLError) as err:
        raise KubeAuthError(
            f"cannot load the cluster CA {str(ca_file or 'data')!r}: {err}"
        ) from err
    return ctx


def connection(
    *,
    api_url: str = "",
    token_file: Path | None = None,
    ca_file: Path | None = None,
    kubeconfig: Path | None = None,
    insecure_skip_tls_verify: bool = False,
    environ: Mapping[str, str] | None = None,
) -> KubeConnection:
    """Resolve the connection: explicit settings, a kubeconfig, or the in-cluster account."""
    env = os.environ if environ is None else environ
    if kubeconfig is not None:
        return _from_kubeconfig(kubeconfig, insecure_skip_tls_verify)
    if not api_url:
        host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
        if not host or not port:
            raise KubeAuthError(
                "no api_url, no kubeconfig and not in a cluster (KUBERNETES_SERVICE_HOST unset)"
            )
        host = f"[{host}]" if ":" in host else host
        api_url = f"https://{host}:{port}"
        token_file = token_file or SA_DIR / "token"
        ca_file = ca_file or SA_DIR / "ca.crt"
    if token_file is None:
        raise KubeAuthError("token_file is required with api_url")
    return KubeConnection(
        api_url.rstrip("/"), _file_token(token_file), _ssl(ca_file, insecure_skip_tls_verify)
    )


def _from_kubeconfig(path: Path, insecure: bool) -> KubeConnection:
    import base64  # noqa: PLC0415 - only kubeconfig users need these

    import yaml  # noqa: PLC0415

    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as err:
        raise KubeAuthError(f"kubeconfig {str(path)!r}: {err}") from err
    try:
        ctx_name = doc["current-context"]
        ctx = next(c["context"] for c in doc["contexts"] if c["name"] == ctx_name)
        cluster = next(c["cluster"] for c in doc["clusters"] if c["name"] == ctx["cluster"])
        user = next(u["user"] for u in doc["users"] if u["name"] == ctx["user"])
    except (KeyError, TypeError, StopIteration) as err:
        raise KubeAuthError(f"kubeconfig {str(path)!r}: no usable current context") from err
    if "token" in user:
        token = str(user["token"])

        def tok() -> str:
            return token

        token_fn: Callable[[], str] = tok
    elif "tokenFile" in user:
        token_fn = _file_token(Path(user["tokenFile"]))
    else:
        raise KubeAuthError(
            f"kubeconfig {str(path)!r}: user {ctx['user']!r} has no token "
            "(client certificates and exec plugins are not supported)"
        )
    ca_data = cluster.get("certificate-authority-data")
    ca_file = cluster.get("certificate-authority")
    return KubeConnection(
        str(cluster["server"]).rstrip("/"),
        token_fn,
        _ssl(
            Path(ca_file) if ca_file else None,
            insecure or bool(cluster.get("insecure-skip-tls-verify")),
            base64.b64decode(ca_data) if ca_data else None,
        ),
    )


def _ptr(*parts: str) -> str:
    """A JSON Pointer (RFC 6901) from raw path segments."""
    return "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in parts)


def api_message(body: Any) -> str:
    """The ``message`` of a Kubernetes Status body (or the body itself)."""
    return str(body.get("message", "")) if isinstance(body, dict) else str(body)


class KubeClient:
    """One API server session: JSON requests with the bearer token, a timeout per request."""

    def __init__(self, conn: KubeConnection, *, timeout_s: float = 10.0) -> None:
        self._conn = conn
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    def _begin(self) -> tuple[aiohttp.ClientSession, dict[str, str]]:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        try:
            headers = {
                "Authorization": f"Bearer {self._conn.token()}",
                "Accept": "application/json",
            }
        except KubeAuthError as err:
            raise DeliveryError(f"kubernetes: {err}") from err
        return self._session, headers

    async def get_bytes(self, path: str, *, limit: int = 64 << 20) -> tuple[int, bytes]:
        """(HTTP status, the raw body) of a GET, for callers that decode it through a model.

        A body over ``limit`` bytes is refused (DeliveryError) before it is held whole.
        """
        session, headers = self._begin()
        url = self._conn.api_url + path
        try:
            async with session.get(url, headers=headers, ssl=self._conn.ssl) as resp:
                if resp.status >= 300:
                    return resp.status, await read_error_body(resp)
                body = bytearray()
                async for chunk in resp.content.iter_any():
                    body += chunk
                    if len(body) > limit:
                        resp.close()
                        raise DeliveryError(f"kubernetes GET {url}: an answer over {limit} bytes")
                return resp.status, bytes(body)
        except (aiohttp.ClientError, TimeoutError) as err:
            raise DeliveryError(f"kubernetes GET {url}: {type(err).__name__}: {err}") from err

    @contextlib.asynccontextmanager
    async def stream(
        self, path: str, *, idle_timeout_s: float
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """A long GET (a watch): no total timeout, at most ``idle_timeout_s`` of silence.

        DeliveryError when it cannot be opened or breaks.
        """
        session, headers = self._begin()
        url = self._conn.api_url + path
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=self._timeout.total, sock_read=idle_timeout_s
        )
        try:
            async with session.get(
                url, headers=headers, ssl=self._conn.ssl, timeout=timeout
            ) as resp:
                yield resp
        except (aiohttp.ClientError, TimeoutError) as err:
            raise DeliveryError(f"kubernetes GET {url}: {type(err).__name__}: {err}") from err

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
    ) -> tuple[int, Any]:
        """(HTTP status, the parsed body); raises DeliveryError when the server is not reached."""
        session, headers = self._begin()
        data = None
        if body is not None:
            data = orjson.dumps(body)
            headers["Content-Type"] = content_type
        url = self._conn.api_url + path
        try:
            async with session.request(
                method, url, data=data, headers=headers, ssl=self._conn.ssl
            ) as resp:
                status = resp.status
                raw = await resp.read() if status < 300 else await read_error_body(resp)
        except (aiohttp.ClientError, TimeoutError) as err:
            raise DeliveryError(f"kubernetes {method} {url}: {type(err).__name__}: {err}") from err
        try:
            return status, orjson.loads(raw) if raw else {}
        except orjson.JSONDecodeError:
            return status, {"message": raw.decode(errors="replace")[:200]}

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def get_node(self, name: str) -> dict[str, Any]:
        """The node object; DeliveryError (permanent, ``not_found``) when there is none."""
        status, body = await self.call("GET", f"/api/v1/nodes/{quote(name, safe='')}")
        if status == 200 and isinstance(body, dict):
            return body
        if status == 404:
            raise DeliveryError(
                f"{name}: no such Kubernetes node", permanent=True, reason="not_found"
            )
        raise node_error(f"GET node {name}", status, body)


def node_error(what: str, status: int, body: Any) -> DeliveryError:
    """A refused request on a node: a 403 names the RBAC the account lacks."""
    message = api_message(body)
    if status == 403:
        return DeliveryError(
            f"{what}: HTTP 403 Forbidden: {message} (the account needs get, list, watch"
            " and patch on nodes and create on events; see the shipped ClusterRole)",
            permanent=True,
            reason="auth",
        )
    return http_error(f"{what}: HTTP {status}: {message}", status)
