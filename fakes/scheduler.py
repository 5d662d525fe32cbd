"""A fake scheduler that receives rackguard's webhook on loopback and checks signatures."""

from __future__ import annotations

import hmac
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from adapters.schedulers.webhook.sink import SIGNATURE_HEADER, TIMESTAMP_HEADER, sign


@dataclass(slots=True)
class Received:
    """One accepted delivery."""

    payload: dict[str, Any]
    key: str


@dataclass
class FakeWebhookScheduler:
    """Records decisions and the resulting node states; fault controls for tests."""

    secret: bytes
    received: list[Received] = field(default_factory=list)
    node_state: dict[str, str] = field(default_factory=dict)
    # Fault controls: answer this status to the next N requests, or to all while set.
    fail_next: int = 0
    fail_status: int = 503
    rejected_signatures: int = 0
    on_receive: Callable[[Received], None] | None = None
    _runner: web.AppRunner | None = None
    url: str = ""

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        ts = request.headers.get(TIMESTAMP_HEADER, "")
        given = request.headers.get(SIGNATURE_HEADER, "")
        if not hmac.compare_digest(given, sign(self.secret, ts, body)):
            self.rejected_signatures += 1
            return web.json_response({"error": "bad signature"}, status=401)
        if self.fail_next > 0:
            self.fail_next -= 1
            return web.json_response({"error": "injected failure"}, status=self.fail_status)
        payload = orjson.loads(body)
        key = request.headers.get("Idempotency-Key", "")
        if any(r.key == key for r in self.received):
            return web.json_response({"status": "duplicate"})
        item = Received(payload, key)
        self.received.append(item)
        action = payload["action"]
        self.node_state[payload["node"]] = {"drain": "drained", "exclude": "excluded"}.get(
            action, "idle"
        )
        if self.on_receive is not None:
            self.on_receive(item)
        return web.json_response({"status": "ok"})

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Serve on loopback; returns the URL to configure."""
        app = web.Application()
        app.router.add_post("/rackguard", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        bound = self._runner.addresses[0][1]
        self.url = f"http://{host}:{bound}/rackguard"
        return self.url

    async def stop(self) -> None:
        """Stop serving."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
