"""An aiohttp application served on a free loopback port, for the duration of a test."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from types import SimpleNamespace

from aiohttp import web

from daemon.delivery.overrides import AuditEntry, OverrideRequest
from daemon.http.api import ApiContext, make_app


@contextlib.asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    """Serve ``app`` on 127.0.0.1; yields its base URL ("http://127.0.0.1:PORT")."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def serving_api(
    token: bytes | None = None,
    apply_override: Callable[[OverrideRequest], Awaitable[AuditEntry]] | None = None,
) -> AsyncIterator[str]:
    """The API over no service at all: for what is answered before a handler reads any."""

    async def never(req: OverrideRequest) -> AuditEntry:
        raise AssertionError(f"an override was applied: {req}")

    ctx = ApiContext(
        view=SimpleNamespace(),  # type: ignore[arg-type]
        metrics=SimpleNamespace(),  # type: ignore[arg-type]
        apply_override=apply_override or never,
        token=token,
        reads_need_token=False,
        max_event_streams=1,
    )
    async with serving(make_app(ctx)) as base:
        yield base
