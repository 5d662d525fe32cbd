"""One Slurm client: slurmrestd (session, JWT, API version) and the commands (scontrol, squeue).

Slurm's two transports of one backend. The sink, the job notices and steering
all ask through it, so they share one session, one token and one detected API
version, and every command runs with the same SLURM_CONF and timeout.

- REST: ``X-SLURM-USER-NAME`` + ``X-SLURM-USER-TOKEN`` (or ``Authorization:
  Bearer``), the JWT from a file, refreshed before it expires; a 401 or 511
  refreshes it once and repeats the request. The API version is read from the
  server's OpenAPI document, once, and again after a bare 404 (an upgrade may
  drop it).
- Commands: ``scontrol`` and the job commands, with a timeout and a cap on
  what they print (adapters/schedulers/command.py).
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

from adapters.base import DeliveryError
from adapters.schedulers.bounded import read_error_body
from adapters.schedulers.command import OUTPUT_LIMIT, OutputTooLarge, run_command
from adapters.schedulers.slurm.auth import JwtToken, TokenError
from adapters.schedulers.slurm.versions import ApiInfo, api_info, slurm_errors

log = logging.getLogger(__name__)

_AUTH_REJECTED = {401, 511}
_SPEC_PATHS = ("/openapi/v3", "/openapi.json", "/openapi")

WriteVia = Literal["auto", "rest", "scontrol"]
AuthScheme = Literal["x-slurm", "bearer"]


class SlurmClient:
    """slurmrestd and the Slurm commands, as one backend's transports."""

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
    ) -> None:
        if rest_url is None and write_via == "rest":
            raise ValueError("write_via = 'rest' needs a REST URL")
        self.url = rest_url.rstrip("/") if rest_url else None
        self._token = token
        self.user = user
        self._auth = auth
        self._wanted_version = api_version
        self.write_via = write_via
        self.scontrol_argv = tuple(scontrol)
        self._env = dict(os.environ)
        if slurm_conf is not None:
            self._env["SLURM_CONF"] = str(slurm_conf)
        self.timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None
        self._version: str | None = None
        self.rest_writes = False  # known once the API version is
        self.info: ApiInfo | None = None

    @property
    def rest(self) -> bool:
        """Whether a slurmrestd URL is set (else everything goes through the commands)."""
        return self.url is not None

    # ------------------------------------------------------------------ REST

    async def _headers(self) -> dict[str, str]:
        if self._token is None:
            return {}
        token = await self._token.get()
        if self._auth == "bearer":
            return {"Authorization": f"Bearer {token}"}
        return {"X-SLURM-USER-NAME": self.user, "X-SLURM-USER-TOKEN": token}

    def _rejected_token(self, headers: Mapping[str, str]) -> str:
        if "Authorization" in headers:
            return headers["Authorization"].removeprefix("Bearer ")
        return headers.get("X-SLURM-USER-TOKEN", "")

    async def request(
        self, method: str, path: str, body: Mapping[str, Any] | None = None
    ) -> tuple[int, Any]:
        """One request, repeated once with a fresh token after a 401 / 511.

        Returns (status, parsed JSON or text). Raises DeliveryError (transient)
        when the server cannot be reached or no token can be had.
        """
        assert self.url is not None
        if self._session is None or self._session.closed:
            timeout = aiohttp.ClientTimeout(total=self.timeout_s)
            self._session = aiohttp.ClientSession(timeout=timeout)
        url = self.url + path
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
                f"(user {self.user!r}; is AuthAltTypes=auth/jwt set and the key the same?)",
                permanent=True,
                reason="auth",
            )
        try:
            return status, orjson.loads(raw)
        except orjson.JSONDecodeError:
            return status, raw.decode(errors="replace").strip()

    async def ensure_api(self) -> str:
        """Detect the API version and whether REST can write nodes (once)."""
        if self._version is not None:
            return self._version
        spec: Any = None
        last = ""
        for path in _SPEC_PATHS:
            status, body = await self.request("GET", path)
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
        self.rest_writes = info.can_write(version) and self.write_via != "scontrol"
        self.info = info
        self._version = version
        log.info(
            "slurm: slurmrestd API %s; node writes through %s",
            version,
            "REST" if self.rest_writes else "scontrol",
        )
        return version

    def forget_version(self) -> None:
        """Detect the API version again on the next request (a bare 404: maybe an upgrade)."""
        self._version = None

    async def job_api(self) -> str | None:
        """The API version to list and signal running jobs through; None: use the commands.

        None without a REST URL or where the server cannot (Slurm < 23.02).
        Raises DeliveryError while slurmrestd cannot be asked.
        """
        if self.url is None:
            return None
        version = await self.ensure_api()
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
        """One REST request with query parameters (for the job notices).

        A bare 404 (no Slurm error) may be an API version dropped by an upgrade:
        the version is detected again on the next request, as for node reads.
        """
        if params:
            path = f"{path}?{urlencode(params)}"
        status, answer = await self.request(method, path, body)
        if status == 404 and not (isinstance(answer, dict) and slurm_errors(answer)):
            self.forget_version()
        return status, answer

    # ------------------------------------------------------------------ commands

    async def run(self, argv: Sequence[str], limit: int = OUTPUT_LIMIT) -> tuple[int, str, str]:
        """A Slurm command with this client's SLURM_CONF and timeout: (rc, stdout, stderr).

        Raises what run_command raises (OSError, TimeoutError, OutputTooLarge).
        """
        return await run_command(argv, self.timeout_s, self._env, limit=limit)

    async def scontrol(self, *args: str, limit: int = OUTPUT_LIMIT) -> tuple[int, str, str]:
        """``scontrol ARGS``; DeliveryError when it cannot be run, times out or says too much."""
        try:
            return await self.run([*self.scontrol_argv, *args], limit)
        except OSError as err:
            raise DeliveryError(
                f"cannot run {self.scontrol_argv[0]!r}: {err}", permanent=True
            ) from err
        except TimeoutError as err:
            raise DeliveryError(f"scontrol {' '.join(args[:2])} timed out") from err
        except OutputTooLarge as err:
            raise DeliveryError(f"scontrol {' '.join(args[:2])}: {err}") from err

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None


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
