"""The HTTP API for schedulers and operators (aiohttp + orjson), described by /openapi.json.

Errors always have the shape {"error": {"code", "message"}}; malformed input is
a 4xx, never a 5xx. Mutating endpoints need `Authorization: Bearer <token>`,
the token read from `[api] token_file`.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import sqlite3
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec
import orjson
from aiohttp import web
from msgspec import UNSET
from multidict import MultiMapping

from daemon.delivery.outbox import StorageError
from daemon.delivery.overrides import AuditEntry, OverrideError, OverrideRequest, parse_override
from daemon.http import bodies
from daemon.http.charts import add_chart_routes
from daemon.http.decision_log import LogQuery, QueryError
from daemon.http.events import Event, EventHub
from daemon.http.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from daemon.http.notice import NoticeView, add_notice_routes
from daemon.http.openapi import OPENAPI
from daemon.http.page import add_page_routes
from daemon.http.params import (
    DecisionQuery,
    EventsHeaders,
    EventsQuery,
    ParamError,
    decode,
    unix_time,
)
from daemon.http.power_caps import NodePowerCaps, add_power_cap_routes
from daemon.http.steering import add_steering_routes
from policies.model import Condition, Quality, Reading
from policies.tracking import gpu_kind

if TYPE_CHECKING:
    from daemon.http.metrics import Metrics
    from daemon.http.view import ServiceView
    from daemon.service.steering import SteeringStatus

log = logging.getLogger(__name__)
_S = TypeVar("_S", bound=msgspec.Struct)

JSON = "application/json"
MAX_BODY_BYTES = 16 * 1024
SSE_HEARTBEAT_S = 15.0  # a comment line keeps proxies from closing an idle stream
# Probes stay open on any address (a load balancer or kubelet has no token),
# and so does the API's description, which holds no node data.
_OPEN_PATHS = frozenset({"/healthz", "/readyz", "/openapi.json"})


def _no_caps() -> NodePowerCaps:
    """[power_cap] off: no GPUs, no decisions."""
    return NodePowerCaps("", False, [], [])


@dataclass(frozen=True, slots=True)
class ApiContext:
    """What the handlers may use: the read-only view, one writer (overrides), the limits."""

    view: ServiceView
    metrics: Metrics
    apply_override: Callable[[OverrideRequest], Awaitable[AuditEntry]]
    token: bytes | None
    reads_need_token: bool
    max_event_streams: int
    # This node's name and its job notices (None where the scheduler has none).
    notices: Callable[[], tuple[str, NoticeView | None]] = lambda: ("", None)
    # This node's name and its steering (None where the scheduler has no node setting).
    steering: Callable[[], tuple[str, SteeringStatus | None]] = lambda: ("", None)
    # This node's power caps (daemon/http/power_caps.py).
    power_caps: Callable[[], NodePowerCaps] = _no_caps


class _Streams:
    """Counts the open /v1/events streams against the cap."""

    def __init__(self) -> None:
        self.open = 0


_CTX: web.AppKey[ApiContext] = web.AppKey("context")
_STREAMS: web.AppKey[_Streams] = web.AppKey("streams")
_STATE_BODY: web.AppKey[StateBody] = web.AppKey("state_body")


def json_response(body: Any, status: int = 200) -> web.Response:
    """A body (daemon/http/bodies.py) as JSON, serialised with orjson."""
    return web.Response(body=bodies.encode(body), status=status, content_type=JSON)


def error_response(status: int, code: str, message: str) -> web.Response:
    """Every error has the same shape: {"error": {"code", "message"}}."""
    return json_response(bodies.Error(bodies.ErrorDetail(code, message)), status)


class ApiError(Exception):
    """A client error with its status and stable code."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


def series_of(
    r: Reading, now: float, stale_after_s: float | None = None, source_error: str = ""
) -> bodies.Series:
    """One series for the API; past ``stale_after_s`` a value is shown BAD, as the policy sees it.

    A source that stopped answering keeps its last readings in the store; the
    policy ignores them once they are older than its stale limit, and so must
    /v1/state: quality "bad", no value, the last value in the reason.
    """
    age = now - r.mono
    quality, value, reason = r.quality, r.value, r.reason
    stale = stale_after_s is not None and age > stale_after_s and r.value is not None
    if stale:
        quality, value = Quality.BAD, None
        reason = f"stale: {age:.0f}s old, past the policy's {stale_after_s:g}s"
        if source_error:
            reason += f" (source {r.source}: {source_error})"
        reason += f"; last {r.quality.value} value {r.value:g} {r.unit}"
    return bodies.Series(
        key=r.key,
        source=r.source,
        sensor=r.sensor,
        kind=r.kind,
        value=value,
        unit=r.unit,
        quality=quality,
        reason=reason,
        stale=stale,
        age_s=round(age, 3),
        device_ts=r.device_ts,
        server_ts=r.server_ts,
        labels=dict(r.labels),
    )


async def healthz(request: web.Request) -> web.Response:
    """The process is alive and its event loop answers."""
    return json_response(bodies.Health())


async def readyz(request: web.Request) -> web.Response:
    """Every configured source has reported once, and the outbox accepts writes."""
    body = request.app[_CTX].view.readiness()
    return json_response(body, 200 if body.ready else 503)


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

    def get(self, view: ServiceView, caps: Callable[[], NodePowerCaps] = _no_caps) -> bytes:
        """The current body, from the cache when it is fresh enough."""
        now = self._clock()
        gen = view.generation
        if gen != self._generation or now - self._built > self.max_age_s:
            self._body = bodies.encode(_state_body(view, now, caps()))
            self._generation, self._built = gen, now
        return self._body


async def state(request: web.Request) -> web.Response:
    """Every series' latest value, unit, quality and age, and each source's health."""
    ctx = request.app[_CTX]
    body = request.app[_STATE_BODY].get(ctx.view, ctx.power_caps)
    return web.Response(body=body, content_type=JSON)


def _state_body(view: ServiceView, now: float, caps: NodePowerCaps) -> bodies.State:
    outcome = view.outcome
    node = view.config.node
    return bodies.State(
        as_of=time.time(),
        node=node.name,
        rack=node.rack,
        simulated=view.simulated,
        condition=outcome.node.condition if outcome else Condition.UNKNOWN,
        assessment=outcome.node if outcome else None,
        sources={
            s.name: bodies.SourceHealth(
                s.health, s.last_error, s.attempts, s.failures, s.skipped_ticks
            )
            for s in view.sources()
        },
        series=[_series(view, r, now) for r in view.readings()],
        scheduler=view.scheduler_state(),
        power_caps=caps.gpus if caps.enabled else UNSET,
    )


def _series(view: ServiceView, r: Reading, now: float) -> bodies.Series:
    """A series with the policy's stale limit for its kind (policies/tracking.py)."""
    p = view.config.policy
    limit = p.stale_after_s if gpu_kind(r.kind) else p.rack_stale_after_s
    errors = {x.name: x.last_error for x in view.sources() if x.health != "up"}
    return series_of(r, now, limit, errors.get(r.source) or "")


async def assessments(request: web.Request) -> web.Response:
    """The policy's latest view per GPU, node and rack."""
    view = request.app[_CTX].view
    outcome = view.outcome
    if outcome is None:
        return json_response(bodies.Assessments(at=None, node=None, gpus=[], rack=None))
    return json_response(
        bodies.Assessments(
            at=view.evaluated_at,
            node=outcome.node,
            gpus=list(outcome.gpus),
            rack=getattr(outcome, "rack", None),
            note=getattr(outcome, "note", ""),
        )
    )


def _decoded(values: MultiMapping[str], cls: type[_S]) -> _S:
    try:
        return decode(values, cls)
    except ParamError as err:
        raise ApiError(400, "bad_parameter", str(err)) from err


async def decisions(request: web.Request) -> web.Response:
    """The decision log (decisions and audited overrides), newest first, cursor-paged."""
    view = request.app[_CTX].view
    p = _decoded(request.query, DecisionQuery)
    q = LogQuery(
        node=p.node,
        action=p.action,
        kind=p.kind,
        since=unix_time(p.since),
        until=unix_time(p.until),
        limit=p.limit,
        cursor=p.cursor,
    )
    try:
        items, cursor = await view.decision_page(q)
    except QueryError as err:
        raise ApiError(400, "bad_parameter", str(err)) from err
    except StorageError as err:
        raise ApiError(503, "storage", str(err)) from err
    return json_response(bodies.DecisionLog(items, cursor))


async def page_initial(request: web.Request) -> bytes | None:
    """What the node page shows first (state, assessments, the log's first page, the
    charts with their recent history), as one JSON object embedded in the page, so it
    shows data at load without a round trip."""
    view = request.app[_CTX].view
    try:
        items, cursor = await view.decision_page(LogQuery(limit=50))
    except StorageError:
        return None  # the page reads the log itself once the store answers
    assess = (await assessments(request)).body
    assert isinstance(assess, bytes)
    return b"".join(
        (
            b'{"state":',
            request.app[_STATE_BODY].get(view, request.app[_CTX].power_caps),
            b',"assessments":',
            assess,
            b',"decisions":',
            bodies.encode(bodies.DecisionLog(items, cursor)),
            b',"charts":',
            bodies.encode(view.charts()),
            b"}",
        )
    )


async def outbox(request: web.Request) -> web.Response:
    """Decisions waiting for the scheduler, oldest first."""
    view = request.app[_CTX].view
    items = [
        bodies.OutboxItem(
            p.seq, p.decision, p.attempts, p.last_error, p.queued_at, p.origin, p.durable
        )
        for p in view.pending()
    ]
    return json_response(bodies.Outbox(len(items), items, view.refusal or None))


async def events(request: web.Request) -> web.StreamResponse:
    """Server-Sent Events: assessments, decisions, deliveries, overrides; resumable."""
    ctx = request.app[_CTX]
    hub = ctx.view.events
    # Both are checked, though the header wins: a bad value is refused wherever it is.
    header = _decoded(request.headers, EventsHeaders).last_event_id
    query = _decoded(request.query, EventsQuery).last_event_id
    after = header if header is not None else query
    if after is None:
        after = hub.last_id
    if after > hub.last_id:
        # An id from before a restart (ids start again at 1): replay what we kept.
        after = 0
    if request.method == "HEAD":  # what a GET would answer with, no stream held open
        return web.Response(headers={"Content-Type": "text/event-stream"})
    streams = request.app[_STREAMS]
    if streams.open >= ctx.max_event_streams:
        # Each stream holds a socket for as long as the client likes: past the
        # cap, later clients wait, so deliveries keep their file descriptors.
        raise ApiError(
            503,
            "too_many_streams",
            f"{streams.open} event streams are open, the most served at once; retry later",
        )
    streams.open += 1
    try:
        return await _stream(request, hub, after)
    finally:
        streams.open -= 1


async def _stream(request: web.Request, hub: EventHub, after: int) -> web.StreamResponse:
    resp = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
        }
    )
    stream = hub.subscribe(after)
    pending: asyncio.Task[Event] | None = None
    try:
        await resp.prepare(request)
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
        # The client went away (aiohttp's ClientConnectionResetError is one):
        # normal for a stream, not an error worth a traceback.
        log.debug("event stream client %s disconnected", request.remote)
    finally:
        if pending is not None and not pending.done():
            pending.cancel()
            await asyncio.wait({pending})
        await stream.aclose()
    return resp


def _authorized(request: web.Request) -> None:
    token = request.app[_CTX].token
    if token is None:
        raise ApiError(403, "disabled", "overrides are disabled: set [api] token_file")
    _check_bearer(request, token)


def _check_bearer(request: web.Request, token: bytes) -> None:
    given = request.headers.get("Authorization", "")
    scheme, _, value = given.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        value.strip().encode("utf-8", "surrogateescape"), token
    ):
        raise ApiError(401, "unauthorized", "a valid 'Authorization: Bearer <token>' is required")


async def get_overrides(request: web.Request) -> web.Response:
    """The operator overrides in force."""
    return json_response(request.app[_CTX].view.overrides())


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
        req = parse_override(body)
    except OverrideError as err:
        raise ApiError(400, "bad_override", str(err)) from err
    ctx = request.app[_CTX]
    try:
        entry = await ctx.apply_override(req)
    except StorageError as err:
        raise ApiError(503, "storage", f"override not applied: {err}") from err
    return json_response(bodies.OverrideResult(entry, ctx.view.overrides()))


async def openapi(request: web.Request) -> web.Response:
    """This API's OpenAPI 3.1 description."""
    return web.Response(body=orjson.dumps(OPENAPI), content_type=JSON)


async def metrics(request: web.Request) -> web.Response:
    """Prometheus text exposition."""
    body = request.app[_CTX].metrics.render()
    return web.Response(body=body, headers={"Content-Type": METRICS_CONTENT_TYPE})


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error as JSON with a stable shape; internal errors never leak details."""
    try:
        ctx = request.app[_CTX]
        # Every method, not only GET: aiohttp answers HEAD through the GET handlers
        # (headers, Content-Length, an event stream's slot), and the rest are refused
        # only after routing. A request is authorised before anything is looked up.
        if ctx.reads_need_token and request.path not in _OPEN_PATHS:
            if ctx.token is None:  # pragma: no cover - refused by the config
                raise ApiError(403, "disabled", "reads need [api] token_file on this address")
            _check_bearer(request, ctx.token)
        return await handler(request)
    except ApiError as err:
        return error_response(err.status, err.code, str(err))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = exc.reason.lower().replace(" ", "_")
        resp = error_response(exc.status, code, exc.text or exc.reason)
        if "Allow" in exc.headers:  # a 405 says what the resource takes (RFC 9110 15.5.6)
            resp.headers["Allow"] = exc.headers["Allow"]
        return resp
    except sqlite3.Error as err:
        return error_response(503, "storage_unavailable", f"decision store: {err}")


def make_app(ctx: ApiContext) -> web.Application:
    """The aiohttp application over one service's read-only view."""
    app = web.Application(middlewares=[json_errors], client_max_size=MAX_BODY_BYTES)
    app[_CTX] = ctx
    app[_STREAMS] = _Streams()
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
    add_page_routes(app, page_initial)
    add_notice_routes(app, lambda: ctx.notices())  # noqa: PLW0108 (ctx may be uninitialised here)
    add_steering_routes(app, lambda: ctx.steering())  # noqa: PLW0108 (as the notices')
    add_power_cap_routes(app, lambda: ctx.power_caps())  # noqa: PLW0108 (as the notices')
    add_chart_routes(app, lambda: ctx.view.charts())  # noqa: PLW0108 (as the notices')
    return app
