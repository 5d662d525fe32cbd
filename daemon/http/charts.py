"""The page's charts on the API: ``GET /v1/charts``, recent points and the GPUs' forecasts.

The daemon keeps, per charted series, a bounded ring of recent points
(:class:`ChartHistory`), so the page shows the last minutes from the moment it is
opened, not only what it saw since. Bounded by design: at most ``MAX_SERIES``
series of ``WINDOW_S / STEP_S`` points each (48 x 120 = 5,760 points, about
0.6 MB at most; a node with 8 GPUs and a rack's inlet probes and loop is some 15
series, about 0.2 MB). A series is one GPU's temperature, one inlet probe, or the
loop's supply temperature, flow or differential pressure; series past the limit
(label churn from a misbehaving source) are not kept.

Each GPU's forecast is the policy's own: the trend of its thermal margin, with the
confidence band of the slope, and whether the policy trusts it (a significant
trend that has been beating persistence). Only a trusted trend moves a forecast.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from daemon.http.bodies import body_schemas, encode
from policies.model import Reading, SensorKind

JSON = "application/json"
WINDOW_S = 600.0
STEP_S = 5.0
MAX_SERIES = 48

# What the page charts besides the GPUs: the rack's inlet air and the loop.
RACK_KINDS = frozenset(
    {
        SensorKind.INLET_TEMPERATURE,
        SensorKind.COOLANT_SUPPLY_TEMPERATURE,
        SensorKind.COOLANT_FLOW,
        SensorKind.COOLANT_DIFFERENTIAL_PRESSURE,
    }
)


@dataclass(frozen=True, slots=True)
class ChartSeries:
    """One charted series: ``points`` are [unix time, value], oldest first, one per step."""

    key: str  # "gpu3", "inlet_temperature/top", "coolant_flow"
    kind: str
    probe: str  # the inlet probe's label ("" for the others)
    unit: str
    points: list[tuple[float, float]]


@dataclass(frozen=True, slots=True)
class GpuForecast:
    """The policy's temperature trend of one GPU (°C per minute) and its confidence band."""

    gpu: str  # the assessment's subject, "gpu3"
    trusted: bool  # only a trusted trend moves the forecast; else it is persistence
    per_min: float | None
    low_per_min: float | None
    high_per_min: float | None


@dataclass(frozen=True, slots=True)
class Charts:
    """GET /v1/charts: the last ``window_s`` of each charted series, and the forecasts."""

    window_s: float
    step_s: float
    series: list[ChartSeries]
    forecasts: list[GpuForecast]


CHART_BODIES: tuple[type, ...] = (Charts,)
CHART_SCHEMAS: dict[str, Any] = body_schemas(CHART_BODIES)
CHART_PATHS: dict[str, Any] = {
    "/v1/charts": {
        "get": {
            "summary": "Recent points of the charted series, and each GPU's forecast",
            "responses": {
                "200": {
                    "description": "charts",
                    "content": {JSON: {"schema": {"$ref": "#/components/schemas/Charts"}}},
                }
            },
        }
    }
}


def _series_key(r: Reading) -> tuple[str, str] | None:
    """(key, probe) of a charted reading, or None."""
    kind = r.kind
    if kind is SensorKind.GPU_TEMPERATURE:
        gpu = r.labels.get("gpu")
        return (f"gpu{gpu}", "") if gpu is not None else None
    if kind in RACK_KINDS:
        probe = r.labels.get("probe", "")
        return (f"{kind.value}/{probe}" if probe else kind.value, probe)
    return None


class _Ring:
    __slots__ = ("kind", "points", "probe", "started", "unit")

    def __init__(self, kind: str, probe: str, unit: str, size: int) -> None:
        self.kind, self.probe, self.unit = kind, probe, unit
        self.started = -math.inf  # when the newest step began
        self.points: collections.deque[tuple[float, float]] = collections.deque(maxlen=size)


class ChartHistory:
    """Bounded recent points per charted series, fed with every poll's readings."""

    def __init__(
        self, window_s: float = WINDOW_S, step_s: float = STEP_S, max_series: int = MAX_SERIES
    ) -> None:
        self.window_s, self.step_s, self.max_series = window_s, step_s, max_series
        self._size = max(2, math.ceil(window_s / step_s) + 1)
        self._rings: dict[str, _Ring] = {}

    def observe(self, readings: Iterable[Reading]) -> None:
        """Keep one point per step of each charted series (the step's newest value)."""
        for r in readings:
            value = r.value
            if value is None or not r.usable or not math.isfinite(r.wall):
                continue
            found = _series_key(r)
            if found is None:
                continue
            key, probe = found
            ring = self._rings.get(key)
            if ring is None:
                if len(self._rings) >= self.max_series:
                    continue
                ring = self._rings[key] = _Ring(r.kind.value, probe, r.unit, self._size)
            if ring.points and r.wall < ring.points[-1][0]:
                continue  # a clock step back: keep the order
            if not ring.points or r.wall - ring.started >= self.step_s:
                ring.points.append((r.wall, value))
                ring.started = r.wall
            else:
                ring.points[-1] = (r.wall, value)  # the step's newest value

    def series(self, now: float) -> list[ChartSeries]:
        """Every series' points within the window before ``now``: GPUs, inlet, then the loop."""
        since = now - self.window_s
        out = [
            ChartSeries(
                key, ring.kind, ring.probe, ring.unit, [p for p in ring.points if p[0] >= since]
            )
            for key, ring in self._rings.items()
        ]
        out.sort(key=lambda s: (_ORDER.get(s.kind, len(_ORDER)), _natural(s.key)))
        return out


# GPUs first, then the air into the rack, then the loop.
_ORDER = {
    kind.value: i
    for i, kind in enumerate(
        (
            SensorKind.GPU_TEMPERATURE,
            SensorKind.INLET_TEMPERATURE,
            SensorKind.COOLANT_SUPPLY_TEMPERATURE,
            SensorKind.COOLANT_FLOW,
            SensorKind.COOLANT_DIFFERENTIAL_PRESSURE,
        )
    )
}


def _natural(key: str) -> tuple[str, int]:
    head = key.rstrip("0123456789")
    tail = key[len(head) :]
    return (head, int(tail) if tail else -1)


def add_chart_routes(app: web.Application, view: Callable[[], Charts]) -> None:
    """Register GET /v1/charts."""

    async def charts(request: web.Request) -> web.Response:
        return web.Response(body=encode(view()), content_type=JSON)

    app.router.add_get("/v1/charts", charts)
