"""Slurm sink: drain / down / resume nodes through slurmrestd, or ``scontrol`` on Slurm 22.05.

- Reads: ``GET /slurm/<v>/node/{name}`` (one node) or ``GET /slurm/<v>/nodes``.
  Without a REST URL, ``scontrol -o show node``.
- Writes: ``POST /slurm/<v>/node/{name}`` with ``{"state": ["DRAIN"], "reason": ...}``
  where the server offers it (Slurm >= 23.02, v0.0.39 on); otherwise
  ``scontrol update nodename=N state=drain reason=...`` (``write_via``).
- Auth: ``X-SLURM-USER-NAME`` + ``X-SLURM-USER-TOKEN`` (or ``Authorization:
  Bearer``), the JWT from a file, refreshed before it expires; a 401 or 511
  refreshes it once and repeats the request.

Slurm's error numbers become clear errors; those retrying cannot fix (2010 not
an admin, 2018 unknown node, 2028 invalid state) are permanent. The sink does
not decide whether a node may be touched: the outbox reads the node first and
leaves nodes held by someone else alone.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlencode

import aiohttp
import orjson

from adapters.base import DeliveryError, http_error
from adapters.schedulers.base import (
    EXCLUDE_STATE_DEFAULT,
    ExcludeState,
    NodeReadError,
    NodeView,
)
from adapters.schedulers.bounded import read_error_body
from adapters.schedulers.command import OUTPUT_LIMIT, OutputTooLarge, run_command
from adapters.schedulers.listing import ListedNode
from adapters.schedulers.slurm.auth import JwtToken, TokenError
from adapters.schedulers.slurm.listing import listed_scontrol, listed_slurm
from adapters.schedulers.slurm.reason import split_reason
from adapters.schedulers.slurm.versions import (
    PERMANENT_ERRORS,
    ApiInfo,
    api_info,
    node_view,
    slurm_errors,
)
from policies.model import Action, Decision
from policies.safety import scheduler_reason

log = logging.getLogger(__name__)

# Metric labels of the refusals an operator fixes (others are "refused").
_ERROR_REASON = {2010: "auth", 2018: "not_found"}
SLURM_STATE = {Action.DRAIN: "DRAIN", Action.EXCLUDE: "DOWN", Action.RESUME: "RESUME"}
_AUTH_REJECTED = {401, 511}
# ``scontrol -o show nodes`` is ~570 bytes a node: 10,000 nodes are 5.7 MB. A list
# past this is refused whole, never read cut.
NODE_LIST_LIMIT = 64 * 1024 * 1024
_SPEC_PATHS = ("/openapi/v3", "/openapi.json", "/openapi")

WriteVia = Literal["auto", "rest", "scontrol"]
AuthScheme = Literal["x-slurm", "bearer"]


class SlurmSink:
    """Delivers decisions to Slurm and reads nodes back."""

    def __init__(
        self,
        rest_url: str | None,
        *,
        token: JwtToken | None = None,
        user: str = "root",
        auth: AuthScheme = "x-slurm",
        api_version: str | None = None,
        write_via: WriteVia = "auto",
        scontrol: Sequence[str] = ("scontrol",),
        slurm_conf: Path | None = None,
        timeout_s: float = 10.0,
        exclude_state: ExcludeState = EXCLUDE_STATE_DEFAULT,
    ) -> None:
        if rest_url is None and write_via == "rest":
            raise ValueError("write_via = 'rest' needs a REST URL")
        self.name = "slurm"
        self._url = rest_url.rstrip("/") if rest_url else None
        self._token = token
        self._user = user
        self._auth = auth
        self._wanted_version = api_version
        self._write_via = write_via
        self._scontrol = tuple(scontrol)
        self._env = dict(os.environ)
        if slurm_conf is not None:
            self._env["SLURM_CONF"] = str(slurm_conf)
        self._timeout_s = timeout_s
        # "drain": an exclusion drains (running jobs are told and requeued by the
        # job notices); "down": Slurm kills the node's running jobs at once.
        self.exclude_down = exclude_state == "down"
        self._states = dict(SLURM_STATE)
        if not self.exclude_down:
            self._states[Action.EXCLUDE] = "DRAIN"
        self._session: aiohttp.ClientSession | None = None
        self._version: str | None = None
        self._rest_writes = False
        self.info: ApiInfo | None = None

    # ------------------------------------------------------------------ HTTP

    async def _headers(self) -> dict[str, str]:
        if self._token is None:
            return {}
        token = await self._token.get()
        if self._auth == "bearer":
            return {"Authorization": f"Bearer {token}"}
        return {"X-SLURM-USER-NAME": self._user, "X-SLURM-USER-TOKEN": token}

    def _rejected_token(self, headers: Mapping[str, str]) -> str:
        if "Authorization" in headers:
            return headers["Authorization"].removeprefix("Bearer ")
        return headers.get("X-SLURM-USER-TOKEN", "")

    async def _request(
        self, method: str, path: str, body: Mapping[str, Any] | None = None
    ) -> tuple[int, Any]:
        """One request, repeated once with a fresh token after a 401 / 511.

        Returns (status, parsed JSON or text). Raises DeliveryError (transient)
        when the server cannot be reached or no token can be had.
        """
        assert self._url is not None
        if self._session is None or self._session.closed:
            timeout = aiohttp.ClientTimeout(total=self._timeout_s)
            self._session = aiohttp.ClientSession(timeout=timeout)
        url = self._url + path
        data = orjson.dumps(body) if body is not None else None
        try:
            for attempt in (1, 2):
                headers = await self._headers()
                if data is not None:
                    headers["Content-Type"] = "application/json"
                async with self._session.request(method, url, data=data, headers=headers) as resp:
                    status = resp.status
                    raw = await resp.read() if status < 300 else await read_error_body(resp)
                if attempt == 1 and self._token is not None and _token_rejected(status, raw):
                    log.info("slurm: token rejected (HTTP %d); refreshing", status)
                    await self._token.refresh(self._rejected_token(headers))
                    continue
                break
        except TokenError as err:
            raise DeliveryError(f"slurm: {err}") from err
        except (aiohttp.ClientError, TimeoutError) as err:
            raise DeliveryError(f"slurmrestd {url}: {type(err).__name__}: {err}") from err
        if status in _AUTH_REJECTED:
            raise DeliveryError(
                f"slurmrestd {url}: HTTP {status}: the token was refused even after a refresh "
                f"(user {self._user!r}; is AuthAltTypes=auth/jwt set and the key the same?)",
                permanent=True,
                reason="auth",
            )
        try:
            return status, orjson.loads(raw)
        except orjson.JSONDecodeError:
            return status, raw.decode(errors="replace").strip()

    async def _ensure_api(self) -> str:
        """Detect the API version and whether REST can write nodes (once)."""
        if self._version is not None:
            return self._version
        spec: Any = None
        last = ""
        for path in _SPEC_PATHS:
            status, body = await self._request("GET", path)
            if status == 200 and isinstance(body, dict):
                spec = body
                break
            last = f"GET {path}: HTTP {status}"
            if status != 404:
                break  # only a missing path is worth trying the next spelling for
        if spec is None:
            raise DeliveryError(f"slurmrestd: no OpenAPI document ({last})")
        info = api_info(spec)
        try:
            version = info.pick(self._wanted_version)
        except ValueError as err:
            raise DeliveryError(f"slurmrestd: {err}", permanent=True) from err
        self._rest_writes = info.can_write(version) and self._write_via != "scontrol"
        self.info = info
        self._version = version
        log.info(
            "slurm: slurmrestd API %s; node writes through %s",
            version,
            "REST" if self._rest_writes else "scontrol",
        )
        return version

    async def job_api(self) -> str | None:
        """The API version to list and signal running jobs through; None: use the commands.

        None without a REST URL or where the server cannot (Slurm < 23.02).
        Raises DeliveryError while slurmrestd cannot be asked.
        """
        if self._url is None:
            return None
        version = await self._ensure_api()
        return version if self.info is not None and self.info.can_signal(version) else None

    def can_bulk_signal(self, version: str) -> bool:
        """The server lists ``DELETE /slurm/<version>/jobs/`` (signal jobs named in a body)."""
        return self.info is not None and version in self.info.bulk_signal

    async def call(
        self,
        method: str,
        path: str,
        params: Mapping[str, str] | None = None,
        body: Mapping[str, Any] | None = None,
    ) -> tuple[int, Any]:
        """One REST request on this sink's session and token (for the job notices).

        A bare 404 (no Slurm error) may be an API version dropped by an upgrade:
        the version is detected again on the next request, as for node reads.
        """
        if params:
            path = f"{path}?{urlencode(params)}"
        status, answer = await self._request(method, path, body)
        if status == 404 and not (isinstance(answer, dict) and slurm_errors(answer)):
            self._version = None
        return status, answer

    # ------------------------------------------------------------------ reads

    async def read_state(self, nodes: Sequence[str]) -> dict[str, NodeView]:
        """Each node's state and reason; an unknown node has exists=False."""
        try:
            if self._url is None:
                return await self._read_scontrol(nodes)
            return await self._read_rest(nodes)
        except DeliveryError as err:
            raise NodeReadError(str(err), permanent=err.permanent) from err

    async def _read_rest(self, nodes: Sequence[str]) -> dict[str, NodeView]:
        version = await self._ensure_api()
        if len(nodes) == 1:
            status, body = await self._request("GET", f"/slurm/{version}/node/{nodes[0]}")
        else:
            status, body = await self._request("GET", f"/slurm/{version}/nodes")
        if not isinstance(body, dict):
            raise DeliveryError(f"slurmrestd GET nodes: HTTP {status}: {str(body)[:200]}")
        errors = slurm_errors(body)
        # Only Slurm's own "invalid node name" (2018) means the node does not
        # exist; a bare 404 may be a proxy or an API version slurmrestd dropped
        # after an upgrade: detect the version again and retry, never give up.
        unknown = any(num == 2018 for num, _ in errors)
        if status == 404 and not unknown:
            self._version = None
            raise DeliveryError(
                f"slurmrestd GET nodes: HTTP 404 without Slurm error 2018: "
                f"{_error_text(errors, body)}; detecting the API version again"
            )
        if status != 200 and not unknown:
            raise DeliveryError(f"slurmrestd GET nodes: HTTP {status}: {_error_text(errors, body)}")
        seen = {v.node: v for v in map(node_view, body.get("nodes") or [])}
        return {n: seen.get(n, NodeView(n, exists=False)) for n in nodes}

    async def list_nodes(self) -> list[ListedNode]:
        """Every node in one read (``GET /nodes`` or ``scontrol -o show nodes``)."""
        try:
            if self._url is None:
                rc, stdout, stderr = await self._scontrol_run(
                    "-o", "show", "nodes", limit=NODE_LIST_LIMIT
                )
                if rc != 0:
                    raise DeliveryError(f"scontrol show nodes: rc={rc}: {stderr}")
                lines = [ln for ln in stdout.splitlines() if ln.startswith("NodeName=")]
                return [
                    listed_scontrol(ln, parse_scontrol_node(ln) or NodeView("")) for ln in lines
                ]
            version = await self._ensure_api()
            status, body = await self._request("GET", f"/slurm/{version}/nodes")
            if status != 200 or not isinstance(body, dict):
                raise DeliveryError(f"slurmrestd GET nodes: HTTP {status}: {str(body)[:200]}")
            raw = [n for n in body.get("nodes") or [] if isinstance(n, dict)]
            return [listed_slurm(n, node_view(n)) for n in raw]
        except DeliveryError as err:
            raise NodeReadError(str(err), permanent=err.permanent) from err

    async def _read_scontrol(self, nodes: Sequence[str]) -> dict[str, NodeView]:
        out: dict[str, NodeView] = {}
        for node in nodes:
            rc, stdout, stderr = await self._scontrol_run("-o", "show", "node", node)
            if rc != 0:
                said = f"{stdout} {stderr}".lower()  # "Node gpu99 not found" is on stdout
                if "not found" in said or "invalid node name" in said:
                    out[node] = NodeView(node, exists=False)
                    continue
                raise DeliveryError(f"scontrol show node {node}: rc={rc}: {stderr}")
            out[node] = parse_scontrol_node(stdout) or NodeView(node, exists=False)
        return out

    # ------------------------------------------------------------------ writes

    async def deliver(self, decision: Decision) -> None:
        """Ask Slurm for the decision's state; return once Slurm accepted it."""
        if self._url is not None:
            version = await self._ensure_api()
            if self._write_via == "rest" and not self._rest_writes:
                raise DeliveryError(
                    f"slurmrestd {version} cannot update nodes (Slurm < 23.02); "
                    "set write_via = 'scontrol'",
                    permanent=True,
                )
        if self._rest_writes:
            await self._write_rest(decision)
        else:
            await self._write_scontrol(decision)

    async def _write_rest(self, decision: Decision) -> None:
        state = self._states[decision.action]
        body: dict[str, Any] = {"state": [state]}
        if decision.action is not Action.RESUME:
            body["reason"] = scheduler_reason(decision)
        path = f"/slurm/{self._version}/node/{decision.node}"
        status, resp = await self._request("POST", path, body)
        errors = slurm_errors(resp) if isinstance(resp, dict) else []
        if status == 200 and not errors:
            return
        known = [(n, t) for n, t in errors if n in PERMANENT_ERRORS]
        if known:
            num, text = known[-1]
            raise DeliveryError(
                f"{decision.node}: Slurm error {num} on {state}: {text}: {PERMANENT_ERRORS[num]}",
                permanent=True,
                reason=_ERROR_REASON.get(num, "refused"),
            )
        if status == 405:
            raise DeliveryError(
                f"slurmrestd at {self._version} cannot update nodes (HTTP 405); "
                "set write_via = 'scontrol'",
                permanent=True,
            )
        text = _error_text(errors, resp)
        raise http_error(f"{decision.node}: {state} via slurmrestd: HTTP {status}: {text}", status)

    async def _write_scontrol(self, decision: Decision) -> None:
        state = self._states[decision.action]
        args = ["update", f"nodename={decision.node}", f"state={state.lower()}"]
        if decision.action is not Action.RESUME:
            args.append(f"reason={scheduler_reason(decision)}")
        rc, _, stderr = await self._scontrol_run(*args)
        if rc == 0:
            return
        low = stderr.lower()
        if "invalid node name" in low:
            num = 2018
        elif "invalid node state" in low:
            if decision.action is Action.RESUME:
                # 22.05 answers a resume of a node without a live slurmd this way
                # yet clears the drain: the outbox's read-back decides.
                log.debug("%s: scontrol resume said %r; reading back", decision.node, stderr)
                return
            num = 2028
        elif "invalid user" in low or ("access" in low and "denied" in low):
            num = 2010
        else:
            raise DeliveryError(
                f"{decision.node}: scontrol update state={state}: rc={rc}: {stderr}"
            )
        raise DeliveryError(
            f"{decision.node}: scontrol update state={state}: {stderr}: {PERMANENT_ERRORS[num]}",
            permanent=True,
            reason=_ERROR_REASON.get(num, "refused"),
        )

    async def _scontrol_run(self, *args: str, limit: int = OUTPUT_LIMIT) -> tuple[int, str, str]:
        try:
            return await run_command(
                [*self._scontrol, *args], self._timeout_s, self._env, limit=limit
            )
        except OSError as err:
            raise DeliveryError(f"cannot run {self._scontrol[0]!r}: {err}", permanent=True) from err
        except TimeoutError as err:
            raise DeliveryError(f"scontrol {' '.join(args[:2])} timed out") from err
        except OutputTooLarge as err:
            raise DeliveryError(f"scontrol {' '.join(args[:2])}: {err}") from err

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None


def _error_text(errors: list[tuple[int, str]], body: Any) -> str:
    text = "; ".join(f"error {n}: {t}" for n, t in errors) or str(body)[:200]
    if errors and all(n == -1 for n, _ in errors):
        text += " (Slurm 22.05 answers a refused JWT this way: check the token and its user)"
    return text


def _token_rejected(status: int, raw: bytes) -> bool:
    """401 / 511 (23.02 on), or 22.05's way: slurmrestd passes the token through and
    slurmctld's refusal comes back as HTTP 500 with only error -1 "Unspecified error"."""
    if status in _AUTH_REJECTED:
        return True
    if status != 500:
        return False
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return False
    errors = slurm_errors(body) if isinstance(body, dict) else []
    return bool(errors) and all(num == -1 for num, _ in errors)


def parse_scontrol_node(text: str) -> NodeView | None:
    """A node from ``scontrol -o show node`` (one line of Key=Value; Reason= may be followed
    by Comment= and Extra=)."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    if not line.startswith("NodeName="):
        return None
    split = split_reason(line)
    fields = dict(f.split("=", 1) for f in split.head.split() if "=" in f)
    states = [s for s in fields.get("State", "").upper().split("+") if s]
    return NodeView(
        node=fields["NodeName"],
        drained="DRAIN" in states,
        down=any(s.startswith("DOWN") for s in states),
        reason=split.reason,
        detail="+".join(states),
    )
