"""The cap rung on the API: ``GET /v1/power-caps``, per GPU its cap and who set it.

Read-only. The body is NodePowerCaps around daemon/service/power_cap.py's GpuCap
and the last cap decisions; its schema is derived from these dataclasses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from daemon.http.bodies import body_schemas, encode
from daemon.service.power_cap import CapRecord, GpuCap

JSON = "application/json"


@dataclass(frozen=True, slots=True)
class NodePowerCaps:
    """GET /v1/power-caps: this node's GPUs' limits and caps (empty while [power_cap] is
    off), and rackguard's latest cap decisions, newest last."""

    node: str
    enabled: bool
    gpus: list[GpuCap]
    decisions: list[CapRecord]


POWER_CAP_BODIES: tuple[type, ...] = (NodePowerCaps,)
POWER_CAP_SCHEMAS: dict[str, Any] = body_schemas(POWER_CAP_BODIES)

POWER_CAP_PATHS: dict[str, Any] = {
    "/v1/power-caps": {
        "get": {
            "summary": "Power caps: each GPU's limit, rackguard's cap or another actor's",
            "responses": {
                "200": {
                    "description": "power caps",
                    "content": {JSON: {"schema": {"$ref": "#/components/schemas/NodePowerCaps"}}},
                }
            },
        }
    }
}


def add_power_cap_routes(app: web.Application, view: Callable[[], NodePowerCaps]) -> None:
    """Register GET /v1/power-caps."""

    async def power_caps(request: web.Request) -> web.Response:
        return web.Response(body=encode(view()), content_type=JSON)

    app.router.add_get("/v1/power-caps", power_caps)
