"""The OpenAPI 3.1 description served at /openapi.json; tests validate responses against it."""

from __future__ import annotations

from typing import Any

from daemon.clock import UNIX_TIME
from daemon.delivery.overrides import OverrideRequest
from daemon.http import bodies
from daemon.http.bodies import body_schemas, request_schemas
from daemon.http.events import EVENT_DATA
from daemon.http.notice import NOTICE_BODIES, NOTICE_PATHS, NOTICE_SCHEMAS
from daemon.http.steering import STEERING_BODIES, STEERING_PATHS, STEERING_SCHEMAS

_STR = {"type": "string"}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


_ERRORS = {
    "400": _json(_ref("Error"), "malformed request"),
    "default": _json(_ref("Error"), "error"),
}

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

EVENT_BODIES: tuple[type, ...] = tuple(EVENT_DATA.values())
REQUEST_BODIES: tuple[type, ...] = (OverrideRequest,)
# Every model the document describes (the tests check each against its schema).
MODELS: tuple[type, ...] = (
    RESPONSE_BODIES + NOTICE_BODIES + STEERING_BODIES + EVENT_BODIES + REQUEST_BODIES
)

SCHEMAS: dict[str, Any] = {
    **body_schemas(RESPONSE_BODIES + EVENT_BODIES),
    **request_schemas(REQUEST_BODIES),
}
# The policy's model (policies/model.py) does not say which clock a decision's
# `at` is; it is Unix time. (An assessment's monotonic `at` never leaves the node.)
SCHEMAS["Decision"]["properties"]["at"]["description"] = UNIX_TIME

_QUERY = {
    "node": {"name": "node", "in": "query", "schema": _STR},
    "action": {"name": "action", "in": "query", "schema": _STR},
    "kind": {"name": "kind", "in": "query", "schema": {"enum": ["decision", "override"]}},
    "since": {
        "name": "since",
        "in": "query",
        "schema": _STR,
        "description": "unix seconds or ISO 8601",
    },
    "until": {"name": "until", "in": "query", "schema": _STR},
    "limit": {
        "name": "limit",
        "in": "query",
        "schema": {"type": "integer", "minimum": 1, "maximum": 500},
    },
    "cursor": {"name": "cursor", "in": "query", "schema": _STR},
}

OPENAPI: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {
        "title": "rackguard",
        "version": "1",
        "description": "Per-node thermal and power guard for GPU clusters.",
    },
    "components": {
        "schemas": SCHEMAS | NOTICE_SCHEMAS | STEERING_SCHEMAS,
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
    },
    "paths": {
        "/": {
            "get": {
                "summary": "The node page (HTML; reads this API, live over /v1/events)",
                "responses": {"200": {"description": "the page", "content": {"text/html": {}}}},
            }
        },
        "/static/{name}": {
            "get": {
                "summary": "The node page's script and style sheet",
                "parameters": [
                    {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}
                ],
                "responses": {
                    "200": {"description": "the file"},
                    "404": {"description": "no such file"},
                },
            }
        },
        "/healthz": {
            "get": {"summary": "Liveness", "responses": {"200": _json(_ref("Health"), "alive")}}
        },
        "/readyz": {
            "get": {
                "summary": "Every source reported once and the outbox is writable",
                "responses": {
                    "200": _json(_ref("Ready"), "ready"),
                    "503": _json(_ref("Ready"), "not ready"),
                },
            }
        },
        "/openapi.json": {
            "get": {
                "summary": "This document",
                "responses": {
                    "200": {"description": "OpenAPI 3.1", "content": {"application/json": {}}}
                },
            }
        },
        "/metrics": {
            "get": {
                "summary": "Prometheus text format",
                "responses": {"200": {"description": "metrics", "content": {"text/plain": {}}}},
            }
        },
        "/v1/state": {
            "get": {
                "summary": "Every series with value, unit, quality and age",
                "responses": {"200": _json(_ref("State"), "state")},
            }
        },
        "/v1/assessments": {
            "get": {
                "summary": "Per GPU, node and rack: trend, forecast, fault domain",
                "responses": {"200": _json(_ref("Assessments"), "assessments")},
            }
        },
        "/v1/decisions": {
            "get": {
                "summary": "The decision log (decisions and audited overrides), newest first",
                "parameters": list(_QUERY.values()),
                "responses": {"200": _json(_ref("DecisionLog"), "one page"), **_ERRORS},
            }
        },
        "/v1/outbox": {
            "get": {
                "summary": "Decisions not yet confirmed by the scheduler",
                "responses": {"200": _json(_ref("Outbox"), "backlog")},
            }
        },
        "/v1/events": {
            "get": {
                "summary": "Server-Sent Events: assessment, decision, delivery, override, notice",
                "parameters": [{"name": "Last-Event-ID", "in": "header", "schema": _STR}],
                "responses": {
                    "200": {
                        "description": "event stream",
                        "content": {"text/event-stream": {}},
                        # Each frame's ``event:`` and the schema of its ``data:``.
                        "x-events": {kind: _ref(t.__name__) for kind, t in EVENT_DATA.items()},
                    },
                    "503": _json(_ref("Error"), "too many streams open; retry later"),
                    **_ERRORS,
                },
            }
        },
        "/v1/overrides": {
            "get": {
                "summary": "Overrides in force",
                "responses": {"200": _json(_ref("Overrides"), "overrides")},
            },
            "post": {
                "summary": "Pin a node, pause predictive drains, reset the storm breaker",
                "security": [{"bearer": []}],
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _ref("OverrideRequest")}},
                },
                "responses": {
                    "200": _json(_ref("OverrideResult"), "applied and audited"),
                    "401": _json(_ref("Error"), "missing or wrong token"),
                    "403": _json(_ref("Error"), "overrides disabled (no token configured)"),
                    **_ERRORS,
                },
            },
        },
        **NOTICE_PATHS,
        **STEERING_PATHS,
    },
}
