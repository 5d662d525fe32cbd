"""Every API body, byte for byte as clients have always received it.

The bodies are recorded in ``api_bodies.json`` (``RACKGUARD_RECORD_BODIES=1``
rewrites it): a change of a field's name, type, order, null or omission fails
here. Each body is also checked against the served OpenAPI document. The view
is a fixed, hand-made one, so the bodies are the same on every run; only the
clock-derived ``as_of`` and ages are blanked.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType, SimpleNamespace
from typing import Any

import aiohttp
import orjson
import pytest

from daemon.cluster.status import ClusterStatus, EtcdStatus, SchedulerViewStatus
from daemon.config.outbox_path import MEMORY
from daemon.delivery.notices import JobNote, Notice
from daemon.delivery.outbox import DecisionStore, Pending, Status
from daemon.delivery.overrides import OverrideRequest, OverrideStore, parse_override
from daemon.http.api import ApiContext, make_app
from daemon.http.decision_log import LogQuery, page
from daemon.http.events import EVENT_DATA, EventHub, delivery_event
from daemon.http.notice import Notice as NoticeBody
from daemon.http.view import ServiceView, SourceStatus
from policies.codec import to_data
from policies.model import (
    Action,
    Assessment,
    Condition,
    Decision,
    FaultDomain,
    Quality,
    Reading,
    SensorKind,
)
from policies.safety import Pin
from tests.support.openapi import check, check_response
from tests.support.serving import serving

RECORDED = Path(__file__).with_name("api_bodies.json")
TOKEN = "pin-token"
WALL = 1_790_000_000.25

GPU_A = Assessment(
    "gpu0", FaultDomain.GPU, Condition.WARNING, 3.0, 80.5, "celsius", 87.0, 2.5, 156.0, "rising"
)
GPU_B = Assessment("gpu1", FaultDomain.GPU, Condition.OK, 3.0, 55.0, "celsius")
NODE_A = Assessment("node", FaultDomain.NODE, Condition.WARNING, 3.0, 80.5, "celsius", 87.0)
RACK_A = Assessment("r7", FaultDomain.RACK, Condition.OK, 3.0, 9.5, "kilowatt", 30.0, -0.1)
DRAIN = Decision(
    "gpu-node-01", Action.DRAIN, "rackguard: gpu0 hot", FaultDomain.GPU, 4.0, "rg-k1", (GPU_A,),
    dry_run=True,
)  # fmt: skip
RESUME = Decision("gpu-node-01", Action.RESUME, "rackguard: cool", FaultDomain.GPU, 9.0, "rg-k2")


@dataclass
class Outcome:
    node: Assessment
    gpus: list[Assessment]
    rack: Assessment | None = None
    note: str = ""


class FixedView:
    """The part of ServiceView the handlers read, holding fixed data (a real store underneath)."""

    def __init__(self, store: DecisionStore, overrides: OverrideStore) -> None:
        self._store = store
        self._overrides = overrides
        self.events = EventHub()
        self.simulated = False
        self.generation = 0
        self.outcome: Outcome | None = None
        self.evaluated_at: float | None = None
        self.refusal = ""
        self.problem_list: list[str] = []
        self.storage_error = ""
        self.cluster: ClusterStatus | None = None
        self.pending_items: list[Pending] = []
        self.series: list[Reading] = []
        self.source_list: list[SourceStatus] = []
        self.config = SimpleNamespace(
            node=SimpleNamespace(name="gpu-node-01", rack="r7"),
            policy=SimpleNamespace(stale_after_s=30.0, rack_stale_after_s=60.0),
        )

    def sources(self) -> list[SourceStatus]:
        return self.source_list

    def readings(self) -> list[Reading]:
        return self.series

    def pending(self) -> list[Pending]:
        return self.pending_items

    def readiness(self) -> Any:
        return ServiceView.readiness(self)  # type: ignore[arg-type]

    def problems(self) -> list[str]:
        return self.problem_list

    def _cluster(self) -> ClusterStatus | None:
        return self.cluster

    async def decision_page(self, query: LogQuery) -> Any:
        return await self._store.query(lambda db: page(db, query))

    def overrides(self) -> Any:
        return ServiceView.overrides(self)  # type: ignore[arg-type]


class FixedNotices:
    def __init__(self, notices: list[Notice]) -> None:
        self.notices = notices

    def current(self, node: str) -> Notice | None:
        return next((n for n in self.notices if n.node == node and n.open), None)

    def all(self) -> list[Notice]:
        return self.notices


@pytest.fixture
def store() -> Iterator[DecisionStore]:
    s = DecisionStore(MEMORY, wall=lambda: WALL)
    yield s
    s.close()


_CLOCKED = (
    (re.compile(rb'"as_of":[-0-9.e+]+'), b'"as_of":0'),
    (re.compile(rb'"age_s":[-0-9.e+]+'), b'"age_s":0'),
    (re.compile(rb"stale: \d+s old"), b"stale: Ns old"),
)


def _blank_clock(body: bytes) -> bytes:
    for pattern, fixed in _CLOCKED:
        body = pattern.sub(fixed, body)
    return body


def _notice(key: str, *, closed: bool) -> Notice:
    n = Notice(key, "gpu-node-01", Action.DRAIN, "rackguard: gpu0 hot", "gpu", WALL, WALL + 540)
    n.jobs["11"] = JobNote("11", "train", "alice", "USR1", WALL + 1, "done")
    n.jobs["12"] = JobNote("12")
    if closed:
        n.told_at, n.closed_at, n.closed = WALL + 1, WALL + 541, "requeued"
        n.jobs["11"].requeued_at, n.jobs["11"].requeued = WALL + 541, "done"
    return n


async def _frames(http: aiohttp.ClientSession, base: str, count: int) -> list[bytes]:
    """The first ``count`` frames of /v1/events, replayed from the start."""
    frames: list[bytes] = []
    async with http.get(base + "/v1/events", headers={"Last-Event-ID": "0"}) as resp:
        assert resp.status == 200
        frame = b""
        while len(frames) < count:
            line = await resp.content.readline()
            assert line, "the stream ended"
            frame += line
            if line == b"\n":
                frames.append(frame)
                frame = b""
    return frames


async def _record_all(store: DecisionStore) -> dict[str, str]:
    """Every endpoint's body over a few views, by a name saying what it shows."""
    overrides = OverrideStore(store, wall=lambda: WALL, mono=lambda: 5.0)
    view = FixedView(store, overrides)

    async def apply(req: OverrideRequest) -> Any:
        return await overrides.apply(req)

    ctx = ApiContext(
        view=view,  # type: ignore[arg-type]
        metrics=SimpleNamespace(render=lambda: b""),  # type: ignore[arg-type]
        apply_override=apply,
        token=TOKEN.encode(),
        reads_need_token=False,
        max_event_streams=4,
        notices=lambda: ("gpu-node-01", notices),
    )
    notices: FixedNotices | None = None
    bodies: dict[str, str] = {}
    async with serving(make_app(ctx)) as base, aiohttp.ClientSession() as http:

        async def take(name: str, path: str, status: int = 200, **kw: Any) -> None:
            method = "POST" if "json" in kw else "GET"
            async with http.request(method, base + path, **kw) as resp:
                assert resp.status == status, (name, await resp.text())
                raw = await resp.read()
            # Each body matches the schema the document gives for its path and status.
            check_response(path, method, status, orjson.loads(raw))
            bodies[name] = _blank_clock(raw).decode()

        await take("healthz", "/healthz")
        # Nothing known yet: no sources, no outcome, nothing pending.
        await take("readyz.empty", "/readyz")
        await take("state.empty", "/v1/state")
        await take("assessments.empty", "/v1/assessments")
        await take("outbox.empty", "/v1/outbox")
        await take("overrides.empty", "/v1/overrides")
        await take("decisions.empty", "/v1/decisions")
        await take("node_notice.none", "/v1/node/notice")
        await take("notices.none", "/v1/notices")

        mono = time.monotonic()
        view.source_list = [
            SourceStatus("gpus", "up", "", 12, 0, 0, True),
            SourceStatus("pdu", "down", "timeout after 2 s", 9, 4, 1, False),
        ]
        view.series = [
            Reading("gpus", "gpu0.temperature", SensorKind.GPU_TEMPERATURE, 80.5, "celsius",
                    Quality.GOOD, mono - 0.5, WALL, labels=MappingProxyType({"uuid": "GPU-1"})),
            Reading("gpus", "gpu1.power", SensorKind.GPU_POWER, None, "watt", Quality.BAD,
                    mono - 0.5, WALL, reason="NVML_ERROR_UNKNOWN", device_ts=WALL - 1),
            Reading("pdu", "outlet3.power", SensorKind.POWER, 1250.0, "watt",
                    Quality.GOOD, mono - 600.0, WALL, server_ts=WALL - 2),
        ]  # fmt: skip
        view.generation = 1
        view.outcome = Outcome(NODE_A, [GPU_A, GPU_B], RACK_A, "rack power from 1 of 2 PDUs")
        view.evaluated_at = 3.0
        view.problem_list = ["scheduler refuses: HTTP 401"]
        view.refusal = "HTTP 401 unauthorized"
        view.cluster = ClusterStatus(
            "etcd",
            True,
            SchedulerViewStatus(False, None),
            EtcdStatus(False, 3, "connection refused"),
        )
        view.pending_items = [
            Pending(DRAIN, 2, "HTTP 503", 7, WALL - 10, "policy", True),
            Pending(RESUME, 0, "", 8, WALL - 5, "reconcile", False),
        ]
        await take("readyz.not_ready", "/readyz", status=503)
        view.problem_list, view.source_list[1] = [], SourceStatus("pdu", "up", "", 9, 4, 1, True)
        view.cluster = ClusterStatus("scheduler", False, SchedulerViewStatus(True, 64))
        await take("readyz.ready", "/readyz")
        view.source_list[1] = SourceStatus("pdu", "down", "timeout after 2 s", 9, 4, 1, True)
        await take("state.full", "/v1/state")
        await take("assessments.full", "/v1/assessments")
        view.outcome = Outcome(NODE_A, [GPU_A], None)
        await take("assessments.no_rack", "/v1/assessments")
        await take("outbox.full", "/v1/outbox")

        def add_decisions(db: Any) -> None:
            for seq, d, status, done in (
                (1, DRAIN, "confirmed", WALL - 3),
                (2, RESUME, "pending", None),
            ):
                db.execute(
                    "INSERT INTO decisions (seq, key, base_key, node, action, body, origin, "
                    "status, attempts, last_error, outcome, queued_at, done_at) "
                    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    (seq, d.key, d.key, d.node, d.action.value, orjson.dumps(to_data(d)),
                     "policy", status, 1, "", "read back" if done else "", WALL - 20 + seq, done),
                )  # fmt: skip

        await store.write(add_decisions)
        auth = {"Authorization": f"Bearer {TOKEN}"}
        pin = {"action": "pin", "node": "n9", "pin": "excluded", "reason": "fans", "actor": "bob"}
        await take("post_overrides.pin", "/v1/overrides", json=pin, headers=auth)
        pause = {"action": "pause_predictive", "reason": "maintenance"}
        await take("post_overrides.pause", "/v1/overrides", json=pause,
                   headers=auth)  # fmt: skip
        await take("overrides.full", "/v1/overrides")
        await take("decisions.full", "/v1/decisions")
        await take("decisions.page", "/v1/decisions?limit=2")
        await take("decisions.bad", "/v1/decisions?limit=0", status=400)
        await take("events.bad_id", "/v1/events", status=400, headers={"Last-Event-ID": "x"})
        bad = {"action": "pin", "node": "n9", "reason": "x", "pin": "sideways"}
        await take("post_overrides.bad", "/v1/overrides", status=400, json=bad,
                   headers=auth)  # fmt: skip
        await take("post_overrides.unauthorized", "/v1/overrides", status=401, json=bad)
        async with http.get(base + "/v1/nothing") as resp:
            assert resp.status == 404
            raw = await resp.read()
        check("Error", orjson.loads(raw))  # no path of the document: the one error shape
        bodies["not_found"] = raw.decode()
        huge = {**pin, "reason": "x" * 20_000}
        await take("post_overrides.too_large", "/v1/overrides", status=413, json=huge,
                   headers=auth)  # fmt: skip
        async with http.post(base + "/v1/overrides", data=b"{}", headers=auth) as resp:
            assert resp.status == 415
            bodies["post_overrides.not_json"] = (await resp.read()).decode()

        notices = FixedNotices([_notice("rg-k1", closed=False), _notice("rg-k0", closed=True)])
        await take("node_notice.open", "/v1/node/notice")
        await take("notices.two", "/v1/notices")

        # Each kind of event, its data as the daemon publishes it (daemon/app.py).
        hub = view.events
        hub.publish("assessment", GPU_A)
        hub.publish("decision", DRAIN)
        hub.publish("delivery", delivery_event(DRAIN, Status.CONFIRMED, "read back"))
        hub.publish("override", await overrides.apply(parse_override(pin)))
        hub.publish("notice", NoticeBody.of(notices.notices[0]))
        frames = await _frames(http, base, hub.last_id)
        hub.close()  # the stream's handler returns now, not at its next heartbeat
        for frame in frames:
            kind = re.search(rb"^event: (\w+)$", frame, re.M)
            assert kind is not None, frame
            data = orjson.loads(frame.split(b"data: ", 1)[1])
            check(EVENT_DATA[kind[1].decode()].__name__, data)  # as /openapi.json says
            bodies[f"event.{kind[1].decode()}"] = frame.decode()
    assert overrides.pins == {"n9": (Pin.EXCLUDED, "fans")}
    return bodies


async def test_every_body_is_byte_for_byte_as_recorded(store: DecisionStore) -> None:
    bodies = await _record_all(store)
    if os.environ.get("RACKGUARD_RECORD_BODIES"):
        RECORDED.write_bytes(orjson.dumps(bodies, option=orjson.OPT_INDENT_2) + b"\n")
    recorded = orjson.loads(RECORDED.read_bytes())
    assert bodies.keys() == recorded.keys()
    for name, body in bodies.items():
        assert body == recorded[name], f"{name} changed"
