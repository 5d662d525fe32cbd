"""Webhook sink: each decision POSTed as JSON, signed with HMAC-SHA256; 2xx confirms.

The signature covers ``<timestamp>.<body>`` so a receiver can reject replays
older than its tolerance: ``X-Rackguard-Signature: sha256=<hex>`` and
``X-Rackguard-Timestamp: <unix seconds>``. ``Idempotency-Key`` repeats the
decision's key so a receiver can drop duplicates of a retried delivery.
"""

from __future__ import annotations

import hashlib
import hmac
import time

import aiohttp
import orjson

from adapters.base import DeliveryError, http_error
from adapters.schedulers.bounded import read_error_body
from adapters.schedulers.decision_json import decision_to_dict
from policies.model import Decision

SIGNATURE_HEADER = "X-Rackguard-Signature"
TIMESTAMP_HEADER = "X-Rackguard-Timestamp"


def sign(secret: bytes, timestamp: str, body: bytes) -> str:
    """The signature header's value for a body sent at ``timestamp``."""
    mac = hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


class WebhookSink:
    """Delivers decisions to one URL."""

    def __init__(self, url: str, secret: bytes, *, timeout_s: float = 5.0) -> None:
        self.name = "webhook"
        self._url = url
        self._secret = secret
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def deliver(self, decision: Decision) -> None:
        """POST one decision; return once the receiver answered 2xx."""
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        body = orjson.dumps(decision_to_dict(decision))
        ts = str(int(time.time()))
        headers = {
            "Content-Type": "application/json",
            TIMESTAMP_HEADER: ts,
            SIGNATURE_HEADER: sign(self._secret, ts, body),
            "Idempotency-Key": decision.key,
        }
        try:
            async with self._session.post(self._url, data=body, headers=headers) as resp:
                if 200 <= resp.status < 300:
                    return
                text = (await read_error_body(resp)).decode(errors="replace")[:200]
                raise http_error(f"HTTP {resp.status} from {self._url}: {text}", resp.status)
        except (aiohttp.ClientError, TimeoutError) as err:
            raise DeliveryError(f"{self._url}: {type(err).__name__}: {err}") from err

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None
