"""The job notice on the node's own API: ``GET /v1/node/notice`` and ``GET /v1/notices``.

Read-only and open (no token) like every GET: a training process, a Slurm
prolog/epilog or an elastic-training agent on the node reads "checkpoint by T,
reason, domain" and checkpoints on its own, with or without a signal. The same
body is sent as the ``notice`` event on ``/v1/events`` whenever a notice opens,
changes or closes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import orjson
from aiohttp import web

from daemon.delivery.notices import Notice

JSON = "application/json"


class NoticeView(Protocol):
    """What the routes read: the open notice of a node and the notices kept."""

    def current(self, node: str) -> Notice | None:
        """The node's open notice, or None."""

    def all(self) -> list[Notice]:
        """Every notice kept, newest first."""


def notice_body(node: str, notice: Notice | None) -> dict[str, Any]:
    """GET /v1/node/notice's body: ``{"node", "notice": null | {...}}``."""
    return {"node": node, "notice": notice.to_dict() if notice is not None else None}


def add_notice_routes(
    app: web.Application, view: Callable[[], tuple[str, NoticeView | None]]
) -> None:
    """Register the routes; ``view()`` is (this node, None where the scheduler has no notices)."""

    async def node_notice(request: web.Request) -> web.Response:
        node, v = view()
        body = notice_body(node, v.current(node) if v is not None else None)
        return web.Response(body=orjson.dumps(body), content_type=JSON)

    async def notices(request: web.Request) -> web.Response:
        _, v = view()
        body = {"notices": [n.to_dict() for n in v.all()] if v is not None else []}
        return web.Response(body=orjson.dumps(body), content_type=JSON)

    app.router.add_get("/v1/node/notice", node_notice)
    app.router.add_get("/v1/notices", notices)


_NUM_OR_NULL = {"type": ["number", "null"]}
_STR = {"type": "string"}

NOTICE_SCHEMAS: dict[str, Any] = {
    "NoticeJob": {
        "type": "object",
        "required": ["job_id", "signal", "signaled_at", "signaled", "requeued_at", "requeued"],
        "properties": {
            "job_id": _STR,
            "name": _STR,
            "user": _STR,
            "signal": {
                "type": "string",
                "description": "how it was told: USR1 (Slurm), annotation (Kubernetes); empty: not",
            },
            "signaled_at": _NUM_OR_NULL,
            "signaled": {"type": "string", "description": "done, gone, refused: ..., unknown: ..."},
            "requeued_at": _NUM_OR_NULL,
            "requeued": {
                "type": "string",
                "description": "done, gone, refused: ..., blocked: ... (asked again)",
            },
        },
    },
    "Notice": {
        "type": "object",
        "required": ["key", "node", "action", "reason", "domain", "checkpoint_by", "jobs"],
        "properties": {
            "key": {"type": "string", "description": "the decision's key"},
            "node": _STR,
            "action": {"enum": ["drain", "exclude"]},
            "reason": _STR,
            "domain": _STR,
            "noticed_at": {"type": "number"},
            "checkpoint_by": {"type": "number", "description": "Unix time: requeue after this"},
            "told_at": _NUM_OR_NULL,
            "closed_at": _NUM_OR_NULL,
            "closed": {"type": "string", "description": "requeued, resumed before the deadline"},
            "error": {
                "type": "string",
                "description": "why the last step failed and is being retried; empty: none",
            },
            "jobs": {"type": "array", "items": {"$ref": "#/components/schemas/NoticeJob"}},
        },
    },
    "NodeNotice": {
        "type": "object",
        "required": ["node", "notice"],
        "properties": {
            "node": _STR,
            "notice": {"oneOf": [{"$ref": "#/components/schemas/Notice"}, {"type": "null"}]},
        },
    },
    "Notices": {
        "type": "object",
        "required": ["notices"],
        "properties": {
            "notices": {"type": "array", "items": {"$ref": "#/components/schemas/Notice"}}
        },
    },
}


def _ok(schema: str, description: str) -> dict[str, Any]:
    ref = {"$ref": f"#/components/schemas/{schema}"}
    return {"200": {"description": description, "content": {JSON: {"schema": ref}}}}


NOTICE_PATHS: dict[str, Any] = {
    "/v1/node/notice": {
        "get": {
            "summary": "This node's open job notice (checkpoint by T), or null; no token needed",
            "responses": _ok("NodeNotice", "the notice"),
        }
    },
    "/v1/notices": {
        "get": {
            "summary": "Job notices kept, newest first: deadline, jobs told, jobs requeued",
            "responses": _ok("Notices", "notices"),
        }
    },
}
