"""The OpenAPI 3.1 description served at /openapi.json; tests validate responses against it."""

from __future__ import annotations

from typing import Any

from daemon.http.notice import NOTICE_PATHS, NOTICE_SCHEMAS
from policies.codec import schema_components
from policies.model import Assessment, Decision

_NUM_OR_NULL = {"type": ["number", "null"]}
_STR = {"type": "string"}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


_ERRORS = {
    "400": _json(_ref("Error"), "malformed request"),
    "default": _json(_ref("Error"), "error"),
}

# The model's components (Decision, Assessment and the enums they use) are derived
# from its dataclasses; the rest are the API's own bodies.
SCHEMAS: dict[str, Any] = {
    **schema_components((Decision, Assessment)),
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["code", "message"],
                "properties": {"code": _STR, "message": _STR},
            }
        },
    },
    "Series": {
        "type": "object",
        "required": ["key", "source", "sensor", "kind", "value", "unit", "quality", "age_s"],
        "properties": {
            "key": _STR,
            "source": _STR,
            "sensor": _STR,
            "kind": _STR,
            "value": _NUM_OR_NULL,
            "unit": _STR,
            "quality": {"enum": ["good", "uncertain", "bad", "absent"]},
            "stale": {
                "type": "boolean",
                "description": "older than the policy's stale limit: shown bad, without value",
            },
            "reason": _STR,
            "age_s": {"type": "number"},
            "device_ts": _NUM_OR_NULL,
            "server_ts": _NUM_OR_NULL,
            "labels": {"type": "object", "additionalProperties": _STR},
        },
    },
    "State": {
        "type": "object",
        "required": ["as_of", "node", "rack", "condition", "sources", "series", "simulated"],
        "properties": {
            "as_of": {"type": "number", "description": "when the ages were computed (Unix s)"},
            "simulated": {
                "type": "boolean",
                "description": "true when the GPUs are a simulation (demo, tests), never a node",
            },
            "node": _STR,
            "rack": _STR,
            "condition": _STR,
            "assessment": {"oneOf": [_ref("Assessment"), {"type": "null"}]},
            "sources": {
                "type": "object",
                "additionalProperties": {
                    "type": "object",
                    "required": ["health"],
                    "properties": {
                        "health": {"enum": ["starting", "up", "degraded", "down"]},
                        "last_error": _STR,
                        "attempts": {"type": "integer"},
                        "failures": {"type": "integer"},
                        "skipped_ticks": {"type": "integer"},
                    },
                },
            },
            "series": {"type": "array", "items": _ref("Series")},
        },
    },
    "Assessments": {
        "type": "object",
        "required": ["node", "gpus", "rack"],
        "properties": {
            "at": _NUM_OR_NULL,
            "node": {"oneOf": [_ref("Assessment"), {"type": "null"}]},
            "gpus": {"type": "array", "items": _ref("Assessment")},
            "rack": {"oneOf": [_ref("Assessment"), {"type": "null"}]},
            "note": _STR,
        },
    },
    "LogItem": {
        "type": "object",
        "required": ["kind", "id", "at", "node", "action"],
        "properties": {
            "kind": {"enum": ["decision", "override"]},
            "id": {"type": "integer"},
            "at": {"type": "number"},
            "node": _STR,
            "action": _STR,
            "decision": _ref("Decision"),
            "delivery": {
                "type": "object",
                "properties": {
                    "status": {"enum": ["pending", "confirmed", "superseded", "skipped", "failed"]},
                    "attempts": {"type": "integer"},
                    "last_error": _STR,
                    "outcome": _STR,
                    "origin": _STR,
                    "done_at": _NUM_OR_NULL,
                },
            },
            "actor": _STR,
            "override": {"type": "object"},
        },
    },
    "DecisionLog": {
        "type": "object",
        "required": ["items", "next_cursor"],
        "properties": {
            "items": {"type": "array", "items": _ref("LogItem")},
            "next_cursor": {"type": ["string", "null"]},
        },
    },
    "Outbox": {
        "type": "object",
        "required": ["pending", "items"],
        "properties": {
            "pending": {"type": "integer"},
            # The scheduler's refusal an operator must fix (auth, not found), or null.
            "refusal": {"type": ["string", "null"]},
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["seq", "decision", "attempts", "last_error"],
                    "properties": {
                        "seq": {"type": "integer"},
                        "decision": _ref("Decision"),
                        "attempts": {"type": "integer"},
                        "last_error": _STR,
                        "queued_at": {"type": "number"},
                        "origin": _STR,
                        "durable": {"type": "boolean"},
                    },
                },
            },
        },
    },
    "Overrides": {
        "type": "object",
        "required": ["pins", "predictive_paused"],
        "properties": {
            "pins": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["node", "pin", "reason"],
                    "properties": {
                        "node": _STR,
                        "pin": {"enum": ["never_drain", "excluded"]},
                        "reason": _STR,
                    },
                },
            },
            "predictive_paused": {"type": "boolean"},
            "paused_reason": _STR,
        },
    },
    "OverrideRequest": {
        "type": "object",
        "required": ["action", "reason"],
        "additionalProperties": False,
        "properties": {
            "action": {
                "enum": ["pin", "unpin", "pause_predictive", "resume_predictive", "reset_storm"]
            },
            "node": _STR,
            "pin": {"enum": ["never_drain", "excluded"]},
            "reason": {"type": "string", "minLength": 1, "maxLength": 256},
            "actor": {"type": "string", "maxLength": 256},
        },
    },
    "OverrideResult": {
        "type": "object",
        "required": ["applied", "overrides"],
        "properties": {"applied": {"type": "object"}, "overrides": _ref("Overrides")},
    },
    "Ready": {
        "type": "object",
        "required": ["ready", "sources", "outbox", "problems", "simulated"],
        "properties": {
            "ready": {"type": "boolean"},
            "simulated": {"type": "boolean"},
            "sources": {"type": "object", "additionalProperties": {"type": "boolean"}},
            "outbox": {
                "type": "object",
                "properties": {"writable": {"type": "boolean"}, "error": _STR},
            },
            # Why not ready: the disk refusing or stalling, a refusal by the scheduler.
            "problems": {"type": "array", "items": _STR},
        },
    },
    "Health": {
        "type": "object",
        "required": ["status"],
        "properties": {"status": {"const": "ok"}},
    },
}

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
        "schemas": SCHEMAS | NOTICE_SCHEMAS,
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
                    "200": {"description": "event stream", "content": {"text/event-stream": {}}},
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
    },
}
