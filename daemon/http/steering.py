"""Steering on the API and in the metrics: ``GET /v1/steering`` and rackguard_steering_*.

Read-only. The body is NodeSteering around daemon/service/steering.py's
SteeringStatus; its schema is derived from those dataclasses.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from daemon.http.bodies import body_schemas, encode
from daemon.service.steering import RESULTS, Steering, SteeringStatus

JSON = "application/json"


@dataclass(frozen=True, slots=True)
class NodeSteering:
    """GET /v1/steering: this node, and its steering (null where the scheduler has no
    node setting to steer: a webhook, or none)."""

    node: str
    steering: SteeringStatus | None


STEERING_BODIES: tuple[type, ...] = (NodeSteering,)
STEERING_SCHEMAS: dict[str, Any] = body_schemas(STEERING_BODIES)

STEERING_PATHS: dict[str, Any] = {
    "/v1/steering": {
        "get": {
            "summary": "Steering new work to cool nodes: headroom, bucket, the value written",
            "responses": {
                "200": {
                    "description": "steering status",
                    "content": {JSON: {"schema": {"$ref": "#/components/schemas/NodeSteering"}}},
                }
            },
        }
    }
}


def add_steering_routes(
    app: web.Application, view: Callable[[], tuple[str, SteeringStatus | None]]
) -> None:
    """Register GET /v1/steering; ``view()`` is (this node, its status or None)."""

    async def steering(request: web.Request) -> web.Response:
        body = NodeSteering(*view())
        return web.Response(body=encode(body), content_type=JSON)

    app.router.add_get("/v1/steering", steering)


class SteeringCollector:
    """rackguard_steering_writes_total{result} and the bucket in force."""

    def __init__(self, steering: Steering) -> None:
        self.steering = steering

    def collect(self) -> Iterator[Metric]:
        """Writes by result; the bucket in place (absent until one is)."""
        writes = CounterMetricFamily(
            "rackguard_steering_writes",
            "Steering writes of the node's Weight or label, by result (written, restored;"
            " foreign: left alone, changed by someone else; failed).",
            labels=["result"],
        )
        for result in RESULTS:
            writes.add_metric([result], self.steering.writes[result])
        yield writes
        bucket = self.steering.bucket
        if bucket is not None:
            yield GaugeMetricFamily(
                "rackguard_steering_bucket",
                "The headroom bucket in place on the node (0 = least headroom).",
                value=bucket,
            )
