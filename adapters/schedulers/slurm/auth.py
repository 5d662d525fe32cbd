"""slurmrestd's JWT: read from a file, refreshed by a configured command before it expires.

The refresh command either prints a fresh token (``scontrol token`` prints
``SLURM_JWT=<token>``; a bare token works too) or rewrites the token file and
prints nothing, in which case the file is read again. The token's ``exp`` claim
is read without verifying the signature: only slurmctld can verify it, and
rackguard only needs to know when to ask for a new one.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import orjson

from adapters.schedulers.command import OutputTooLarge, run_command

log = logging.getLogger(__name__)


class TokenError(Exception):
    """No usable token: the file is unreadable or the refresh command failed."""


def token_expiry(token: str) -> float | None:
    """The token's ``exp`` claim (unix seconds), or None when it has none or is not a JWT."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    payload = parts[1] + "=" * (-len(parts[1]) % 4)
    try:
        claims = orjson.loads(base64.urlsafe_b64decode(payload))
    except (binascii.Error, ValueError, orjson.JSONDecodeError):
        return None
    exp = claims.get("exp") if isinstance(claims, dict) else None
    return float(exp) if isinstance(exp, int | float) else None


def parse_token_output(text: str) -> str:
    """The token in a refresh command's stdout: ``SLURM_JWT=<t>`` or a bare token line."""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("SLURM_JWT="):
            return line.removeprefix("SLURM_JWT=")
        if line:
            return line
    return ""


class JwtToken:
    """The current token; refreshed ``refresh_before_s`` before it expires, or on demand."""

    def __init__(
        self,
        token_file: Path,
        *,
        refresh_command: Sequence[str] = (),
        refresh_before_s: float = 300.0,
        timeout_s: float = 10.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._file = token_file
        self._command = tuple(refresh_command)
        self._before = refresh_before_s
        self._timeout = timeout_s
        self._clock = clock
        self._token = ""
        self._lock = asyncio.Lock()
        self.refreshes = 0

    async def get(self) -> str:
        """A token that is not about to expire."""
        async with self._lock:
            if not self._token:
                self._token = self._read_file()
            exp = token_expiry(self._token)
            if self._command and exp is not None and exp - self._clock() < self._before:
                await self._refresh_locked()
            return self._token

    async def refresh(self, rejected: str) -> str:
        """A new token after the server rejected ``rejected`` (401 / 511)."""
        async with self._lock:
            if self._token != rejected:
                return self._token  # another request refreshed it already
            if self._command:
                await self._refresh_locked()
            else:
                self._token = self._read_file()  # maybe rotated by someone else
            return self._token

    def _read_file(self) -> str:
        try:
            text = self._file.read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            raise TokenError(
                f"the Slurm token file {str(self._file)!r} is not text: {err}"
            ) from err
        except OSError as err:
            raise TokenError(
                f"cannot read the Slurm token file {str(self._file)!r}: {err.strerror or err}"
            ) from err
        token = parse_token_output(text)
        if not token:
            raise TokenError(f"the Slurm token file {str(self._file)!r} is empty")
        return token

    async def _refresh_locked(self) -> None:
        try:
            rc, out, err_out = await run_command(self._command, self._timeout)
        except OSError as err:
            raise TokenError(f"token refresh command {self._command[0]!r}: {err}") from err
        except TimeoutError as err:
            raise TokenError(f"token refresh command timed out after {self._timeout}s") from err
        except OutputTooLarge as err:
            raise TokenError(f"token refresh command: {err}") from err
        if rc != 0:
            raise TokenError(f"token refresh command exited {rc}: {err_out[:200]}")
        token = parse_token_output(out) or self._read_file()
        self._token = token
        self.refreshes += 1
        exp = token_expiry(token)
        left = f"{exp - self._clock():.0f}s" if exp is not None else "unknown"
        log.info("slurm: JWT refreshed (valid for %s)", left)
