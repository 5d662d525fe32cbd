"""The job notice on the node's own API: ``GET /v1/node/notice`` and ``GET /v1/notices``.

Read-only and open (no token) like every GET: a training process, a Slurm
prolog/epilog or an elastic-training agent on the node reads "checkpoint by T,
reason, domain" and checkpoints on its own, with or without a signal. The same
body is sent as the ``notice`` event on ``/v1/events`` whenever a notice opens,
changes or closes.

A power cap (``GET /v1/power-caps``) opens no notice: the job keeps running, slower
(throughput ~ (P/P_demand)^0.4 under a binding cap), and nothing is asked of it. A
cap on lost coolant flow is followed at once by the notice and drain; a margin cap
that does not hold is followed by them after the settle time (docs/power-cap.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Protocol

from aiohttp import web
from msgspec import Meta

from daemon.clock import UNIX_TIME, UnixTime
from daemon.delivery import notices as job_notices
from daemon.http.bodies import body_schemas, encode
from policies.model import Action

JSON = "application/json"


class NoticeView(Protocol):
    """What the routes read: the open notice of a node and the notices kept."""

    def current(self, node: str) -> job_notices.Notice | None:
        """The node's open notice, or None."""

    def all(self) -> list[job_notices.Notice]:
        """Every notice kept, newest first."""


@dataclass(frozen=True, slots=True)
class NoticeJob:
    """One job on a notice: whether and how it was told, whether it was requeued."""

    job_id: str
    name: str
    user: str
    signal: Annotated[
        str, Meta(description="how it was told: USR1 (Slurm), annotation (Kubernetes); empty: not")
    ]
    signaled_at: UnixTime | None
    signaled: Annotated[
        str,
        Meta(description="done, gone, refused: ..., unknown: ..., failed: ... (for good)"),
    ]
    requeued_at: UnixTime | None
    requeued: Annotated[
        str,
        Meta(
            description="done, gone, refused: ..., blocked: ... (asked again),"
            " failed: ... (for good: the reason an operator must see)"
        ),
    ]
    checkpoint_by: Annotated[
        float | None,
        Meta(
            description="its own deadline (a job that appeared after the tell), Unix time;"
            " null: the notice's"
        ),
    ]
    error: Annotated[
        str,
        Meta(description="why this job's last step failed; asked again at retry_at; empty: none"),
    ]
    retry_at: Annotated[float | None, Meta(description="Unix time of this job's next try")]

    @classmethod
    def of(cls, j: job_notices.JobNote) -> NoticeJob:
        """A job note as the API shows it."""
        return cls(
            j.job_id, j.name, j.user, j.signal, j.signal_started_at, j.signaled,
            j.requeued_at, j.requeued, j.deadline, j.error, j.retry_at if j.error else None,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Notice:
    """A drain or exclusion's notice to the jobs of one node, as the API shows it."""

    key: Annotated[str, Meta(description="the decision's key")]
    node: str
    action: Action
    reason: str
    domain: str
    noticed_at: UnixTime
    checkpoint_by: Annotated[float, Meta(description=f"requeue after this; {UNIX_TIME}")]
    told_at: UnixTime | None
    closed_at: UnixTime | None
    closed: Annotated[str, Meta(description="requeued, resumed before the deadline")]
    error: Annotated[
        str,
        Meta(
            description="why the last step failed and is being retried (the node's list, or"
            " each job still failing: 'ns/pod: ...'); empty: none"
        ),
    ]
    jobs: list[NoticeJob]

    @classmethod
    def of(cls, n: job_notices.Notice) -> Notice:
        """A notice as the API (and the ``notice`` event) shows it."""
        return cls(
            n.key, n.node, n.action, n.reason, n.domain, n.noticed_at, n.deadline, n.told_at,
            n.closed_at, n.closed, n.error, [NoticeJob.of(j) for j in n.jobs.values()],
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class NodeNotice:
    """GET /v1/node/notice: this node's open notice, or null."""

    node: str
    notice: Notice | None


@dataclass(frozen=True, slots=True)
class Notices:
    """GET /v1/notices: the notices kept, newest first."""

    notices: list[Notice]


def add_notice_routes(
    app: web.Application, view: Callable[[], tuple[str, NoticeView | None]]
) -> None:
    """Register the routes; ``view()`` is (this node, None where the scheduler has no notices)."""

    async def node_notice(request: web.Request) -> web.Response:
        node, v = view()
        current = v.current(node) if v is not None else None
        body = NodeNotice(node, Notice.of(current) if current is not None else None)
        return web.Response(body=encode(body), content_type=JSON)

    async def notices(request: web.Request) -> web.Response:
        _, v = view()
        body = Notices([Notice.of(n) for n in v.all()] if v is not None else [])
        return web.Response(body=encode(body), content_type=JSON)

    app.router.add_get("/v1/node/notice", node_notice)
    app.router.add_get("/v1/notices", notices)


NOTICE_BODIES: tuple[type, ...] = (NodeNotice, Notices)
NOTICE_SCHEMAS: dict[str, Any] = body_schemas(NOTICE_BODIES)


def _ok(schema: str, description: str) -> dict[str, Any]:
    ref = {"$ref": f"#/components/schemas/{schema}"}
    return {"200": {"description": description, "content": {JSON: {"schema": ref}}}}


NOTICE_PATHS: dict[str, Any] = {
    "/v1/node/notice": {
        "get": {
            "summary": "This node's open job notice (checkpoint by T), or null; no token needed",
            "description": (
                "A power cap opens no notice: the job keeps running at reduced power (see"
                " /v1/power-caps). A drain or exclusion that follows a cap opens one as usual."
            ),
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
