"""The HTTP API for schedulers and operators (aiohttp + orjson), described by /openapi.json.

Errors always have the shape {"error": {"code", "message"}}; malformed input is
a 4xx, never a 5xx. Mutating endpoints need `Authorization: Bearer <token>`,
the token read from `[api] token_file`.
"""

from __future__ import annotations

import asyncio
import hmac
import sqlite3
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from adapters.schedulers.decision_json import assessment_to_dict, decision_to_dict
from daemon.delivery.outbox import StorageError
from daemon.delivery.overrides import OverrideError, OverrideRequest
from daemon.http.decision_log import MAX_LIMIT, LogQuery, QueryError, page
from daemon.http.events import Event
from daemon.http.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from daemon.http.openapi import OPENAPI
from daemon.http.page import add_page_routes
from policies.model import Quality, Reading
from policies.tracking import gpu_kind

if TYPE_CHECKING:
    from daemon.service.app import Daemon

JSON = "application/json"
MAX_BODY_BYTES = 16 * 1024
SSE_HEARTBEAT_S = 15.0  # a comment line keeps proxies from closing an idle stream
_DAEMON: web.AppKey[Daemon] = web.AppKey("daemon")
_STATE_BODY: web.AppKey[StateBody] = web.AppKey("state_body")


def json_response(data: Any, status: int = 200) -> web.Response:
    """Serialise with orjson (about 10x faster than json for our bodies)."""
    return web.Response(body=orjson.dumps(data), status=status, content_type=JSON)


def error_response(status: int, code: str, message: str) -> web.Response:
    """Every error has the same shape: {"error": {"code", "message"}}."""
    return json_response({"error": {"code": code, "message": message}}, status)


class ApiError(Exception):
    """A client error with its status and stable code."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


def reading_to_dict(
    r: Reading, now: float, stale_after_s: float | None = None, source_error: str = ""
) -> dict[str, Any]:
    """One series for the API; past ``stale_after_s`` a value is shown BAD, as the policy sees it.

    A source that stopped answering keeps its last readings in the store; the
    policy ignores them once they are older than its stale limit, and so must
    /v1/state: quality "bad", no value, the last value in the reason.
    """
    age = now - r.mono
    quality, value, reason = r.quality.value, r.value, r.reason
    stale = stale_after_s is not None and age > stale_after_s and r.value is not None
    if stale:
        quality, value = Quality.BAD.value, None
        reason = f"stale: {age:.0f}s old, past the policy's {stale_after_s:g}s"
        if source_error:
            reason += f" (source {r.source}: {source_error})"
        reason += f"; last {r.quality.value} value {r.value:g} {r.unit}"
    return {
        "key": r.key,
        "source": r.source,
        "sensor": r.sensor,
        "kind": r.kind.value,
        "value": value,
        "unit": r.unit,
        "quality": quality,
        "reason": reason,
        "stale": stale,
        "age_s": round(age, 3),
        "device_ts": r.device_ts,
        "server_ts": r.server_ts,
        "labels": dict(r.labels),
    }


async def healthz(request: web.Request) -> web.Response:
    """The process is alive and its event loop answers."""
    return json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """Every configured source has reported once, and the outbox accepts writes."""
    d = request.app[_DAEMON]
    sources = {r.name: d.store.reported(r.name) for r in d.runners}
    checks = d.decisions.health() + d.deliverer.health()
    problems = [reason for ok, reason in checks if not ok]
    ready = all(sources.values()) and not problems
    body = {
        "ready": ready,
        "sources": sources,
        "outbox": {"writable": not d.decisions.error, "error": d.decisions.error},
        "problems": problems,
    }
    if d.fleet is not None:
        # Degraded coordination does not make the agent unready: it still protects its node.
        body["cluster"] = d.fleet.status()
    return json_response(body, 200 if ready else 503)


class StateBody:
    """/v1/state's serialised body, rebuilt when readings change or after ``max_age_s``.

    A scheduler or dashboard may poll /v1/state hard; building ~200 series per
    request would cost most of the API's throughput. Ages are exact as of
    ``as_of`` and at most ``max_age_s`` older when served.
    """

    def __init__(
        self, max_age_s: float = 0.25, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_age_s = max_age_s
        self._clock = clock
        self._body = b""
        self._generation = -1
        self._built = 0.0

    def get(self, daemon: Daemon) -> bytes:
        """The current body, from the cache when it is fresh enough."""
        now = self._clock()
        gen = daemon.store.generation
        if gen != self._generation or now - self._built > self.max_age_s:
            self._body = orjson.dumps(_state_dict(daemon, now))
            self._generation, self._built = gen, now
        return self._body


async def state(request: web.Request) -> web.Response:
    """Every series' latest value, unit, quality and age, and each source's health."""
    body = request.app[_STATE_BODY].get(request.app[_DAEMON])
    return web.Response(body=body, content_type=JSON)


def _state_dict(d: Daemon, now: float) -> dict[str, Any]:
    outcome = d.engine.last
    return {
        "as_of": time.time(),
        "node": d.config.node.name,
        "rack": d.config.node.rack,
        "condition": outcome.node.condition.value if outcome else "unknown",
        "assessment": assessment_to_dict(outcome.node) if outcome else None,
        "sources": {
            r.name: {
                "health": r.health.value,
                "last_error": r.stats.last_error,
                "attempts": r.stats.attempts,
                "failures": r.stats.failures,
                "skipped_ticks": r.stats.skipped_ticks,
            }
            for r in d.runners
        },
        "series": [_series(d, r, now) for r in d.store.readings()],
    }


def _series(d: Daemon, r: Reading, now: float) -> dict[str, Any]:
    """A series with the policy's stale limit for its kind (policies/tracking.py)."""
    p = d.config.policy
    limit = p.stale_after_s if gpu_kind(r.kind) else p.rack_stale_after_s
    errors = {x.name: x.stats.last_error for x in d.runners if x.health.value != "up"}
    return reading_to_dict(r, now, limit, errors.get(r.source) or "")


async def assessments(request: web.Request) -> web.Response:
    """The policy's latest view per GPU, node and rack."""
    d = request.app[_DAEMON]
    outcome = d.engine.last
    if outcome is None:
        return json_response({"node": None, "gpus": [], "rack": None, "at": None})
    rack = getattr(outcome, "rack", None)
    return json_response(
        {
            "at": outcome.node.at,
            "node": assessment_to_dict(outcome.node),
            "gpus": [assessment_to_dict(g) for g in outcome.gpus],
            "rack": assessment_to_dict(rack) if rack is not None else None,
            "note": getattr(outcome, "note", ""),
        }
    )


def _time_param(request: web.Request, name: str) -> float | None:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return None
    try:
        return float(raw)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise ApiError(
            400, "bad_parameter", f"{name}: unix seconds or an ISO 8601 time, got {raw!r}"
        ) from None


def _limit_param(request: web.Request, default: int = 100) -> int:
    raw = request.query.get("limit")
    if raw is None:
        return default
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= MAX_LIMIT:
        raise ApiError(400, "bad_parameter", f"limit: an integer from 1 to {MAX_LIMIT}")
    return int(raw)


async def decisions(request: web.Request) -> web.Response:
    """The decision log (decisions and audited overrides), newest first, cursor-paged."""
    d = request.app[_DAEMON]
    kind = request.query.get("kind")
    if kind not in (None, "decision", "override"):
        raise ApiError(400, "bad_parameter", "kind: 'decision' or 'override'")
    q = LogQuery(
        node=request.query.get("node"),
        action=request.query.get("action"),
        kind=kind,
        since=_time_param(request, "since"),
        until=_time_param(request, "until"),
        limit=_limit_param(request),
        cursor=request.query.get("cursor"),
    )
    try:
        items, cursor = await d.decisions.query(lambda db: page(db, q))
    except QueryError as err:
        raise ApiError(400, "bad_parameter", str(err)) from err
    except StorageError as err:
        raise ApiError(503, "storage", str(err)) from err
    return json_response({"items": items, "next_cursor": cursor})


async def outbox(request: web.Request) -> web.Response:
    """Decisions waiting for the scheduler, oldest first."""
    d = request.app[_DAEMON]
    items = [
        {
            "seq": p.seq,
            "decision": decision_to_dict(p.decision),
            "attempts": p.attempts,
            "last_error": p.last_error,
            "queued_at": p.queued_at,
            "origin": p.origin,
            "durable": p.durable,
        }
        for p in d.decisions.pending()
    ]
    body = {"pending": len(items), "items": items, "refusal": d.deliverer.refusal or None}
    return json_response(body)


async def events(request: web.Request) -> web.StreamResponse:
    """Server-Sent Events: assessments, decisions, deliveries, overrides; resumable."""
    d = request.app[_DAEMON]
    raw = request.headers.get("Last-Event-ID") or request.query.get("last_event_id") or ""
    if raw and not (raw.isascii() and raw.isdigit()):
        raise ApiError(400, "bad_parameter", "Last-Event-ID: a non-negative integer")
    after = int(raw) if raw else d.events.last_id
    if after > d.events.last_id:
        # An id from before a restart (ids start again at 1): replay what we kept.
        after = 0
    resp = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
        }
    )
    await resp.prepare(request)
    stream = d.events.subscribe(after)
    pending: asyncio.Task[Event] | None = None
    try:
        while True:
            # One __anext__ task survives heartbeats: cancelling it (wait_for
            # would) closes the async generator and ends the stream.
            if pending is None:
                pending = asyncio.ensure_future(anext(stream))
            done, _ = await asyncio.wait({pending}, timeout=SSE_HEARTBEAT_S)
            if not done:
                await resp.write(b": keep-alive\n\n")
                continue
            try:
                event = pending.result()
            except StopAsyncIteration:
                break
            pending = None
            await resp.write(event.encode())
    except ConnectionResetError:
        pass  # the client left between two events: nothing to tell it, nothing to log
    finally:
        if pending is not None and not pending.done():
            pending.cancel()
            await asyncio.wait({pending})
        await stream.aclose()
    return resp


def _authorized(request: web.Request) -> None:
    d = request.app[_DAEMON]
    token = d.api_token
    if token is None:
        raise ApiError(403, "disabled", "overrides are disabled: set [api] token_file")
    given = request.headers.get("Authorization", "")
    scheme, _, value = given.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(value.strip().encode(), token):
        raise ApiError(401, "unauthorized", "a valid 'Authorization: Bearer <token>' is required")


async def get_overrides(request: web.Request) -> web.Response:
    """The operator overrides in force."""
    return json_response(request.app[_DAEMON].overrides.current())


async def post_overrides(request: web.Request) -> web.Response:
    """Pin a node, pause or resume predictive drains, reset the storm breaker (audited)."""
    _authorized(request)
    if request.content_type != JSON:
        raise ApiError(415, "unsupported_media_type", "send application/json")
    raw = await request.read()
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as err:
        raise ApiError(400, "bad_json", f"body is not JSON: {err}") from err
    try:
        req = OverrideRequest.parse(body)
    except OverrideError as err:
        raise ApiError(400, "bad_override", str(err)) from err
    try:
        entry = await request.app[_DAEMON].apply_override(req)
    except StorageError as err:
        raise ApiError(503, "storage", f"override not applied: {err}") from err
    return json_response({"applied": entry, "overrides": request.app[_DAEMON].overrides.current()})


async def openapi(request: web.Request) -> web.Response:
    """This API's OpenAPI 3.1 description."""
    return json_response(OPENAPI)


async def metrics(request: web.Request) -> web.Response:
    """Prometheus text exposition."""
    body = request.app[_DAEMON].metrics.render()
    return web.Response(body=body, headers={"Content-Type": METRICS_CONTENT_TYPE})


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error as JSON with a stable shape; internal errors never leak details."""
    try:
        return await handler(request)
    except ApiError as err:
        return error_response(err.status, err.code, str(err))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = exc.reason.lower().replace(" ", "_")
        return error_response(exc.status, code, exc.text or exc.reason)
    except sqlite3.Error as err:
        return error_response(503, "storage_unavailable", f"decision store: {err}")


def make_app(daemon: Daemon) -> web.Application:
    """The aiohttp application for one daemon."""
    app = web.Application(middlewares=[json_errors], client_max_size=MAX_BODY_BYTES)
    app[_DAEMON] = daemon
    app[_STATE_BODY] = StateBody()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/openapi.json", openapi)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/state", state)
    app.router.add_get("/v1/assessments", assessments)
    app.router.add_get("/v1/decisions", decisions)
    app.router.add_get("/v1/outbox", outbox)
    app.router.add_get("/v1/events", events)
    app.router.add_get("/v1/overrides", get_overrides)
    app.router.add_post("/v1/overrides", post_overrides)
    add_page_routes(app)
    return app
