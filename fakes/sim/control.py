"""The harness's control API: loopback HTTP to apply faults and read back what happened.

    GET  /v1/status          the run record (clock, faults applied, first crossing) and the rack now
    GET  /v1/faults          every known fault with its parameters and defaults
    POST /v1/faults/{name}   apply one fault now; body: a JSON object of parameters (or empty)

Errors are 400 with ``{"error": "..."}`` naming the fault and the key; an unknown
fault name lists the known ones; every number has bounds. It binds loopback only
and has no authentication, so it also refuses what a web page open in the
operator's browser could send it (403): a peer that is not loopback, a ``Host``
that is not a loopback name (DNS rebinding), an ``Origin`` other than its own or
a ``Sec-Fetch-Site`` other than same-origin; and a POST must be
``application/json`` (415), which no cross-origin page can send without a CORS
preflight this API never grants.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from fakes.sim.faults import FAULTS, FaultError
from fakes.sim.harness import Harness

HARNESS: web.AppKey[Harness] = web.AppKey("harness", Harness)


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


async def _status(request: web.Request) -> web.Response:
    return _json(request.app[HARNESS].status())


async def _faults(_request: web.Request) -> web.Response:
    return _json(
        {
            "faults": [
                {
                    "name": f.name,
                    "target": f.target.value,
                    "description": f.description,
                    "params": dict(f.params),
                }
                for f in FAULTS.values()
            ]
        }
    )


async def _apply(request: web.Request) -> web.Response:
    body = await request.read()
    try:
        params = orjson.loads(body) if body.strip() else {}
    except orjson.JSONDecodeError as err:
        return _json({"error": f"body: not JSON: {err}"}, 400)
    if not isinstance(params, dict):
        return _json({"error": "body: must be a JSON object of parameters"}, 400)
    try:
        record = request.app[HARNESS].apply(request.match_info["name"], params)
    except FaultError as err:
        return _json({"error": str(err)}, 400)
    return _json(record)


@web.middleware
async def same_machine_only(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Refuse what did not come from a program on this machine (see the module doc)."""
    host = request.host.rsplit(":", 1)[0].strip("[]") if request.host else ""
    own = f"http://{request.host}"
    if not is_loopback(request.remote or ""):
        return _json({"error": "the control API answers loopback only"}, 403)
    if not is_loopback(host):
        return _json({"error": f"Host: {host!r} is not a loopback name"}, 403)
    origin = request.headers.get("Origin")
    if origin is not None and origin != own:
        return _json({"error": f"Origin: {origin!r} is not this API's ({own})"}, 403)
    if request.headers.get("Sec-Fetch-Site", "same-origin") not in ("same-origin", "none"):
        return _json({"error": "Sec-Fetch-Site: a request from another site"}, 403)
    if request.method == "POST" and request.content_type != "application/json":
        return _json({"error": "Content-Type: must be application/json"}, 415)
    return await handler(request)


def is_loopback(host: str) -> bool:
    """True for a loopback address or 'localhost'."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def start_control(harness: Harness, host: str, port: int) -> web.AppRunner:
    """Serve the control API on ``host:port`` (loopback only; ValueError otherwise)."""
    if not is_loopback(host):
        raise ValueError(f"control: {host!r} is not a loopback address (the API has no auth)")
    app = web.Application(middlewares=[same_machine_only], client_max_size=64 * 1024)
    app[HARNESS] = harness
    app.router.add_get("/v1/status", _status)
    app.router.add_get("/v1/faults", _faults)
    app.router.add_post("/v1/faults/{name}", _apply)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
