"""Webhook sink: each decision POSTed as JSON, signed with HMAC-SHA256; 2xx confirms.

The signature covers ``<timestamp>.<body>`` so a receiver can reject replays
older than its tolerance: ``X-Rackguard-Signature: sha256=<hex>`` and
``X-Rackguard-Timestamp: <unix seconds>``. ``Idempotency-Key`` repeats the
decision's key so a receiver can drop duplicates of a retried delivery.

The body is the decision as the API shows it, plus ``checkpoint_by``: the
deadline by which the node's running work should checkpoint (RFC 3339 UTC,
counted from the decision's time: the grace of a drain or of an exclusion), or
null for a resume. It is the last key, so the decision's own bytes are unchanged.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from typing import Any

import aiohttp
import orjson

from adapters.base import DeliveryError, http_error
from adapters.schedulers.bounded import read_error_body
from adapters.schedulers.decision_json import decision_to_dict, rfc3339
from policies.model import Action, Decision

SIGNATURE_HEADER = "X-Rackguard-Signature"
TIMESTAMP_HEADER = "X-Rackguard-Timestamp"


def sign(secret: bytes, timestamp: str, body: bytes) -> str:
    """The signature header's value for a body sent at ``timestamp``."""
    mac = hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


class WebhookSink:
    """Delivers decisions to one URL."""

    def __init__(
        self,
        url: str,
        secret: bytes,
        *,
        timeout_s: float = 5.0,
        grace_s: tuple[float, float] = (540.0, 20.0),
    ) -> None:
        self.name = "webhook"
        self._url = url
        self._secret = secret
        self._grace = {Action.DRAIN: grace_s[0], Action.EXCLUDE: grace_s[1]}
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def deliver(self, decision: Decision) -> None:
        """POST one decision; return once the receiver answered 2xx."""
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        body = orjson.dumps(self.payload(decision))
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

    def payload(self, decision: Decision) -> dict[str, Any]:
        """The decision's wire shape and its ``checkpoint_by``."""
        grace = self._grace.get(decision.action)
        deadline = None if grace is None else rfc3339(decision.at + grace)
        return {**decision_to_dict(decision), "checkpoint_by": deadline}

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None
