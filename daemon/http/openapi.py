"""The OpenAPI 3.1 description served at /openapi.json; tests validate responses against it."""

from __future__ import annotations

from typing import Any

import msgspec

from daemon.clock import UNIX_TIME
from daemon.delivery.overrides import REQUEST_TYPES, OverrideRequest
from daemon.http import bodies
from daemon.http.bodies import body_schemas, request_schemas
from daemon.http.charts import CHART_BODIES, CHART_PATHS, CHART_SCHEMAS
from daemon.http.events import EVENT_DATA
from daemon.http.notice import NOTICE_BODIES, NOTICE_PATHS, NOTICE_SCHEMAS
from daemon.http.page import STATIC_FILES
from daemon.http.params import DecisionQuery, EventsHeaders, EventsQuery, parameters
from daemon.http.power_caps import POWER_CAP_BODIES, POWER_CAP_PATHS, POWER_CAP_SCHEMAS
from daemon.http.steering import STEERING_BODIES, STEERING_PATHS, STEERING_SCHEMAS

_STR = {"type": "string"}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _error(description: str) -> dict[str, Any]:
    return _json(_ref("Error"), description)


# What any operation may answer besides its own: the listener's connection cap.
_BUSY = {"503": _error("busy: at the connection cap (or the store unavailable); retry later")}
# What every operation but the probes and this document may answer: off loopback,
# reads need the token too (as every method does: HEAD and the rest are authorised
# as GET is). On loopback the token is not asked for.
_GUARDED = {"401": _error("off loopback: missing or wrong token")}
_READ_SECURITY: list[dict[str, list[str]]] = [{}, {"bearer": []}]


def _open(
    operation_id: str, summary: str, responses: dict[str, Any], **extra: Any
) -> dict[str, Any]:
    """A GET open on any address (probes, this document)."""
    return {
        "operationId": operation_id,
        "summary": summary,
        **extra,
        "responses": {**_BUSY, **responses},
    }


def _read(
    operation_id: str, summary: str, responses: dict[str, Any], **extra: Any
) -> dict[str, Any]:
    """A GET behind the token where reads need one."""
    guarded = {**_GUARDED, **responses}
    return _open(operation_id, summary, guarded, security=_READ_SECURITY, **extra)


# Every body's component is derived from its dataclass (daemon/http/bodies.py),
# and with them the model's (Decision, Assessment and the enums they use).
RESPONSE_BODIES: tuple[type, ...] = (
    bodies.Error,
    bodies.Series,
    bodies.State,
    bodies.Assessments,
    bodies.LogItem,
    bodies.DecisionLog,
    bodies.Outbox,
    bodies.Overrides,
    bodies.OverrideResult,
    bodies.Ready,
    bodies.Health,
)


def override_request_schema() -> dict[str, Any]:
    """POST /v1/overrides' body: exactly one of the requests, told apart by ``action``."""
    (union,), _ = msgspec.json.schema_components(
        (OverrideRequest,), ref_template="#/components/schemas/{name}"
    )
    return {
        "title": "OverrideRequest",
        "description": "One override; each action takes exactly its own fields.",
        # The tags are distinct, so exactly one branch matches: oneOf, as generators expect.
        "oneOf": union["anyOf"],
        "discriminator": union["discriminator"],
    }


EVENT_BODIES: tuple[type, ...] = tuple(EVENT_DATA.values())
REQUEST_BODIES: tuple[type, ...] = REQUEST_TYPES
# Request bodies that are one of several models, by component name.
REQUEST_UNIONS: dict[str, Any] = {"OverrideRequest": OverrideRequest}
# Every model the document describes (the tests check each against its schema).
MODELS: tuple[type, ...] = (
    RESPONSE_BODIES
    + NOTICE_BODIES
    + STEERING_BODIES
    + POWER_CAP_BODIES
    + CHART_BODIES
    + EVENT_BODIES
    + REQUEST_BODIES
)

SCHEMAS: dict[str, Any] = {
    **body_schemas(RESPONSE_BODIES + EVENT_BODIES),
    **request_schemas(REQUEST_BODIES),
    "OverrideRequest": override_request_schema(),
}
# The policy's model (policies/model.py) does not say which clock a decision's
# `at` is; it is Unix time. (An assessment's monotonic `at` never leaves the node.)
SCHEMAS["Decision"]["properties"]["at"]["description"] = UNIX_TIME

# Links (for a client, and for a stateful tester): the next page of the log, and
# where an applied override shows.
_NEXT_PAGE = {
    "nextPage": {
        "operationId": "listDecisions",
        "description": "the page after this one (while next_cursor is not null)",
        "parameters": {"cursor": "$response.body#/next_cursor"},
    }
}
_AUDITED = {
    "auditEntry": {
        "operationId": "listDecisions",
        "description": "the override in the decision log",
        "parameters": {"kind": "override", "action": "$response.body#/applied/action"},
    },
    "inForce": {"operationId": "getOverrides", "description": "the overrides now in force"},
}
_OVERRIDE_EXAMPLES = {
    "pin": {
        "value": {"action": "pin", "node": "gpu-node-07", "pin": "never_drain", "reason": "burn-in"}
    },
    "unpin": {"value": {"action": "unpin", "node": "gpu-node-07", "reason": "burn-in done"}},
    "pause": {
        "value": {"action": "pause_predictive", "reason": "chiller maintenance", "actor": "ops"}
    },
    "reset_storm": {"value": {"action": "reset_storm", "reason": "storm was a sensor fault"}},
}
_ID = {
    "/v1/node/notice": "getNodeNotice",
    "/v1/notices": "listNotices",
    "/v1/steering": "getSteering",
    "/v1/power-caps": "getPowerCaps",
    "/v1/charts": "getCharts",
}

OPENAPI: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {
        "title": "rackguard",
        "version": "1",
        "description": "Per-node thermal and power guard for GPU clusters.",
    },
    "components": {
        "schemas": SCHEMAS | NOTICE_SCHEMAS | STEERING_SCHEMAS | POWER_CAP_SCHEMAS | CHART_SCHEMAS,
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
    },
    "paths": {
        "/": {
            "get": _read(
                "getPage",
                "The node page (HTML; reads this API, live over /v1/events)",
                {"200": {"description": "the page", "content": {"text/html": {}}}},
            )
        },
        "/static/{name}": {
            "get": _read(
                "getStaticFile",
                "The node page's script and style sheet",
                {
                    "200": {
                        "description": "the file",
                        "content": {"text/javascript": {}, "text/css": {}},
                    },
                    "404": _error("no such file"),
                },
                parameters=[
                    {
                        "name": "name",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "string", "enum": list(STATIC_FILES)},
                    }
                ],
            )
        },
        "/healthz": {
            "get": _open("getHealth", "Liveness", {"200": _json(_ref("Health"), "alive")})
        },
        "/readyz": {
            "get": _open(
                "getReady",
                "Every source reported once and the outbox is writable",
                {
                    "200": _json(_ref("Ready"), "ready"),
                    # An answer, not a failure: Kubernetes takes the node out of service.
                    "503": _json(
                        {"oneOf": [_ref("Ready"), _ref("Error")]},
                        "not ready (a Ready body: problems says why), or at the connection cap",
                    ),
                },
            )
        },
        "/openapi.json": {
            "get": _open(
                "getOpenApi",
                "This document",
                {"200": _json({"type": "object"}, "OpenAPI 3.1")},
            )
        },
        "/metrics": {
            "get": _read(
                "getMetrics",
                "Prometheus text format",
                {"200": {"description": "metrics", "content": {"text/plain": {}}}},
            )
        },
        "/v1/state": {
            "get": _read(
                "getState",
                "Every series with value, unit, quality and age",
                {"200": _json(_ref("State"), "state")},
            )
        },
        "/v1/assessments": {
            "get": _read(
                "getAssessments",
                "Per GPU, node and rack: trend, forecast, fault domain",
                {"200": _json(_ref("Assessments"), "assessments")},
            )
        },
        "/v1/decisions": {
            "get": _read(
                "listDecisions",
                "The decision log (decisions, power cap changes, audited overrides), newest first",
                {
                    "200": {**_json(_ref("DecisionLog"), "one page"), "links": _NEXT_PAGE},
                    "400": _error("a parameter out of its schema"),
                },
                parameters=parameters(DecisionQuery, "query"),
            )
        },
        "/v1/outbox": {
            "get": _read(
                "getOutbox",
                "Decisions not yet confirmed by the scheduler",
                {"200": _json(_ref("Outbox"), "backlog")},
            )
        },
        "/v1/events": {
            "get": _read(
                "streamEvents",
                "Server-Sent Events: assessment, decision, delivery, override, notice",
                {
                    "200": {
                        "description": "event stream",
                        "content": {"text/event-stream": {}},
                        # Each frame's ``event:`` and the schema of its ``data:``.
                        "x-events": {kind: _ref(t.__name__) for kind, t in EVENT_DATA.items()},
                    },
                    "400": _error("an event id out of its schema"),
                },
                parameters=parameters(EventsHeaders, "header") + parameters(EventsQuery, "query"),
            )
        },
        "/v1/overrides": {
            "get": _read(
                "getOverrides", "Overrides in force", {"200": _json(_ref("Overrides"), "overrides")}
            ),
            "post": {
                "operationId": "applyOverride",
                "summary": "Pin a node, pause predictive drains, reset the storm breaker",
                "security": [{"bearer": []}],
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": _ref("OverrideRequest"),
                            "examples": _OVERRIDE_EXAMPLES,
                        }
                    },
                },
                "responses": {
                    "200": {
                        **_json(_ref("OverrideResult"), "applied and audited"),
                        "links": _AUDITED,
                    },
                    "400": _error("not JSON, or not one of the override requests"),
                    "401": _error("missing or wrong token"),
                    "403": _error("overrides disabled (no token configured)"),
                    "413": _error("a body over 16 KiB"),
                    "415": _error("a body that is not application/json"),
                    "503": _error("not applied: the disk refused it, or the connection cap"),
                },
            },
        },
        **{path: {"get": _read(_ID[path], **op["get"])} for path, op in NOTICE_PATHS.items()},
        **{path: {"get": _read(_ID[path], **op["get"])} for path, op in STEERING_PATHS.items()},
        **{path: {"get": _read(_ID[path], **op["get"])} for path, op in POWER_CAP_PATHS.items()},
        **{path: {"get": _read(_ID[path], **op["get"])} for path, op in CHART_PATHS.items()},
    },
}
