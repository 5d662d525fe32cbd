"""The HTTP API against its own OpenAPI document: shapes, paging, SSE resume, overrides."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from daemon.http.api import make_app
from daemon.http.openapi import OPENAPI
from fakes.nvml import fake_node
from fakes.scheduler import FakeWebhookScheduler
from tests.support.daemon_harness import running_daemon
from tests.support.openapi import check, check_response
from tests.support.secrets import write_secret
from tests.support.wait import wait_until

TOKEN = "op-token-123"


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "api.token"
    write_secret(path, TOKEN + "\n")
    return path


async def get(http: aiohttp.ClientSession, url: str, status: int = 200) -> Any:
    async with http.get(url) as resp:
        assert resp.status == status, await resp.text()
        assert resp.content_type == "application/json"
        return await resp.json()


async def post(
    http: aiohttp.ClientSession, url: str, body: Any, token: str | None = TOKEN
) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with http.post(url, json=body, headers=headers) as resp:
        return resp.status, await resp.json()


def test_every_route_is_documented() -> None:
    from daemon.http.api import ApiContext  # noqa: PLC0415

    # Routing needs no service state: an uninitialised context is enough here.
    app = make_app(object.__new__(ApiContext))
    routes = set()
    for r in app.router.routes():
        info = r.resource.get_info() if r.resource else {}
        if r.method != "HEAD":
            routes.add((info.get("path") or info.get("formatter"), r.method.lower()))
    documented = {(p, m) for p, ops in OPENAPI["paths"].items() for m in ops}
    assert routes == documented


async def test_endpoints_match_the_openapi_document(
    receiver: FakeWebhookScheduler, secret_file: Path, token_file: Path, tmp_path: Path
) -> None:
    nvml = fake_node()
    for g in nvml.gpus:
        g.temperature_c = 60.0
    outbox = tmp_path / "outbox.sqlite3"
    async with (
        running_daemon(
            nvml,
            receiver,
            secret_file,
            api_extra=f'token_file = "{token_file}"',
            scheduler_extra=f'outbox_path = "{outbox}"',
        ) as daemon,
        aiohttp.ClientSession() as http,
    ):
        base = f"http://127.0.0.1:{daemon.api_port}"
        assert (await get(http, f"{base}/openapi.json"))["openapi"] == "3.1.0"
        check("Health", await get(http, f"{base}/healthz"))
        ready = await get(http, f"{base}/readyz")
        check("Ready", ready)
        assert ready == {
            "ready": True,
            "sources": {"gpus": True},
            "outbox": {"writable": True, "error": ""},
            "problems": [],
            "simulated": True,  # the fake NVML is injected
        }
        check("State", await get(http, f"{base}/v1/state"))
        await wait_until(
            lambda: daemon.engine.last is not None and len(daemon.engine.last.gpus) == 8
        )
        body = await get(http, f"{base}/v1/assessments")
        check("Assessments", body)
        assert len(body["gpus"]) == 8 and body["node"]["condition"] == "ok"

        # A decision, undeliverable for now: it waits in the outbox.
        receiver.fail_next = 10**6
        nvml.gpus[2].temperature_c = 87.0
        await wait_until(lambda: any(p.last_error for p in daemon.decisions.pending()))
        ob = await get(http, f"{base}/v1/outbox")
        check("Outbox", ob)
        assert ob["pending"] == 1 and ob["items"][0]["decision"]["action"] == "drain"
        assert "HTTP 503" in ob["items"][0]["last_error"]
        receiver.fail_next = 0
        await wait_until(lambda: not daemon.decisions.pending())

        status, res = await post(
            http,
            f"{base}/v1/overrides",
            {
                "action": "pin",
                "node": "gpu-node-09",
                "pin": "never_drain",
                "reason": "firmware test",
                "actor": "alice",
            },
        )
        assert status == 200, res
        check("OverrideResult", res)
        log = await get(http, f"{base}/v1/decisions")
        check("DecisionLog", log)
        kinds = [(i["kind"], i["action"]) for i in log["items"]]
        assert kinds[0] == ("override", "pin") and ("decision", "drain") in kinds
        drain = next(i for i in log["items"] if i["kind"] == "decision")
        assert drain["delivery"]["status"] == "confirmed"
        check("Overrides", await get(http, f"{base}/v1/overrides"))
        # The notice routes, with no job notices on a webhook scheduler.
        for path in ("/v1/node/notice", "/v1/notices"):
            check_response(path, "GET", 200, await get(http, f"{base}{path}"))
        err = await get(http, f"{base}/v1/events?last_event_id=x", status=400)
        check_response("/v1/events", "GET", 400, err)


async def test_decision_log_pages_and_filters(
    receiver: FakeWebhookScheduler, secret_file: Path, token_file: Path
) -> None:
    async with (
        running_daemon(
            fake_node(), receiver, secret_file, api_extra=f'token_file = "{token_file}"'
        ) as daemon,
        aiohttp.ClientSession() as http,
    ):
        base = f"http://127.0.0.1:{daemon.api_port}"
        for i in range(7):
            status, _ = await post(
                http,
                f"{base}/v1/overrides",
                {
                    "action": "pin" if i % 2 == 0 else "unpin",
                    "node": f"n{i % 3}",
                    "pin": "excluded",
                    "reason": f"r{i}",
                }
                if i % 2 == 0
                else {"action": "unpin", "node": f"n{i % 3}", "reason": f"r{i}"},
            )
            assert status == 200
        seen: list[str] = []
        cursor = None
        for _ in range(10):
            q = f"{base}/v1/decisions?limit=3" + (f"&cursor={cursor}" if cursor else "")
            body = await get(http, q)
            seen += [i["override"]["reason"] for i in body["items"]]
            cursor = body["next_cursor"]
            if cursor is None:
                break
        assert seen == [f"r{i}" for i in reversed(range(7))]  # newest first, none twice
        only_n0 = await get(http, f"{base}/v1/decisions?node=n0")
        assert {i["node"] for i in only_n0["items"]} == {"n0"} and len(only_n0["items"]) == 3
        pins = await get(http, f"{base}/v1/decisions?action=pin&kind=override")
        assert len(pins["items"]) == 4
        future = await get(http, f"{base}/v1/decisions?since=2100-01-01T00:00:00Z")
        assert future["items"] == []
        for bad in (
            "limit=0",
            "limit=x",
            "limit=%C2%B2",
            "cursor=garbage!",
            "since=yesterday",
            "kind=other",
        ):
            err = await get(http, f"{base}/v1/decisions?{bad}", status=400)
            check("Error", err)
            assert err["error"]["code"] == "bad_parameter"


async def test_overrides_need_the_token_and_reach_the_policy(
    receiver: FakeWebhookScheduler, secret_file: Path, token_file: Path, tmp_path: Path
) -> None:
    outbox = tmp_path / "outbox.sqlite3"
    extra = {
        "api_extra": f'token_file = "{token_file}"',
        "scheduler_extra": f'outbox_path = "{outbox}"',
    }
    async with (
        running_daemon(fake_node(), receiver, secret_file, **extra) as daemon,
        aiohttp.ClientSession() as http,
    ):
        url = f"http://127.0.0.1:{daemon.api_port}/v1/overrides"
        body = {"action": "pin", "node": "gpu-node-07", "pin": "never_drain", "reason": "x"}
        for token in (None, "wrong", ""):
            status, err = await post(http, url, body, token=token)
            assert status == 401 and err["error"]["code"] == "unauthorized"
        assert daemon.engine.overrides.pins == {}
        for bad, field in (
            ({"action": "explode", "reason": "x"}, "action"),
            ({"action": "pin", "node": "n1", "reason": "x"}, "pin"),
            ({"action": "pin", "node": "n 1", "pin": "excluded", "reason": "x"}, "node"),
            ({"action": "pause_predictive"}, "reason"),
            ({"action": "reset_storm", "reason": "x", "extra": 1}, "extra"),
            ([1, 2], "body"),
        ):
            status, err = await post(http, url, bad)
            assert status == 400, (bad, err)
            assert err["error"]["message"].startswith(field), err
        status, _ = await post(http, url, body)
        assert status == 200
        assert dict(daemon.engine.overrides.pins) == {"gpu-node-07": "never_drain"}
        status, _ = await post(http, url, {"action": "pause_predictive", "reason": "maint"})
        assert status == 200 and daemon.engine.overrides.predictive_paused
        async with http.post(
            url,
            data=b"x" * 20000,
            headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        ) as resp:
            assert resp.status == 413
            assert (await resp.json())["error"]["code"] == "request_entity_too_large"
    # A restart keeps the pins and the pause (same state file).
    async with running_daemon(fake_node(), receiver, secret_file, **extra) as daemon:
        assert dict(daemon.engine.overrides.pins) == {"gpu-node-07": "never_drain"}
        assert daemon.engine.overrides.predictive_paused


async def test_overrides_are_disabled_without_a_token(
    receiver: FakeWebhookScheduler, secret_file: Path
) -> None:
    async with (
        running_daemon(fake_node(), receiver, secret_file) as daemon,
        aiohttp.ClientSession() as http,
    ):
        status, err = await post(
            http,
            f"http://127.0.0.1:{daemon.api_port}/v1/overrides",
            {"action": "reset_storm", "reason": "x"},
        )
        assert status == 403 and err["error"]["code"] == "disabled"


async def read_until(
    resp: aiohttp.ClientResponse,
    done: Callable[[list[tuple[int, str, str]]], bool],
    heartbeats: int = 0,
) -> list[tuple[int, str, str]]:
    """Parse SSE frames until ``done(events)`` holds and ``heartbeats`` came (10 s at most)."""
    events: list[tuple[int, str, str]] = []
    fields: dict[str, str] = {}
    beats = 0
    async with asyncio.timeout(10):
        while not (done(events) and beats >= heartbeats):
            line = (await resp.content.readline()).decode().rstrip("\n")
            if not line:
                if "id" in fields:
                    events.append((int(fields["id"]), fields["event"], fields["data"]))
                fields = {}
            elif line.startswith(":"):
                beats += 1
            else:
                key, _, value = line.partition(": ")
                fields[key] = value
    return events


def overrides_in(events: list[tuple[int, str, str]]) -> list[tuple[int, dict[str, Any]]]:
    return [(i, orjson.loads(d)) for i, k, d in events if k == "override"]


async def test_sse_stream_delivers_and_resumes_with_last_event_id(
    receiver: FakeWebhookScheduler, secret_file: Path, token_file: Path
) -> None:
    async with (
        running_daemon(
            fake_node(), receiver, secret_file, api_extra=f'token_file = "{token_file}"'
        ) as daemon,
        aiohttp.ClientSession() as http,
    ):
        base = f"http://127.0.0.1:{daemon.api_port}"
        async with http.get(f"{base}/v1/events?last_event_id=0") as resp:
            assert resp.headers["Content-Type"] == "text/event-stream"
            for i in range(3):
                await post(
                    http, f"{base}/v1/overrides", {"action": "reset_storm", "reason": f"e{i}"}
                )
            got = await read_until(resp, lambda ev: len(overrides_in(ev)) == 3)
        ids = [i for i, _, _ in got]
        assert ids == sorted(ids) and len(set(ids)) == len(ids)
        assert any(k == "assessment" for _, k, _ in got)  # assessments are streamed too
        first, second, third = overrides_in(got)
        assert [first[1]["reason"], second[1]["reason"], third[1]["reason"]] == ["e0", "e1", "e2"]
        # Reconnect after the first override: the later ones are replayed, in order.
        async with http.get(f"{base}/v1/events", headers={"Last-Event-ID": str(first[0])}) as resp:
            replay = await read_until(resp, lambda ev: len(overrides_in(ev)) == 2)
        assert all(i > first[0] for i, _, _ in replay)
        assert [o["reason"] for _, o in overrides_in(replay)] == ["e1", "e2"]
        err = await get(http, f"{base}/v1/events?last_event_id=abc", status=400)
        assert err["error"]["code"] == "bad_parameter"


def test_state_body_is_cached_until_readings_change_or_it_ages() -> None:
    from types import SimpleNamespace  # noqa: PLC0415

    from daemon.config.policy import PolicyConfig  # noqa: PLC0415
    from daemon.http.api import StateBody  # noqa: PLC0415
    from daemon.http.events import EventHub  # noqa: PLC0415
    from daemon.http.view import ServiceView  # noqa: PLC0415
    from daemon.service.state import StateStore  # noqa: PLC0415
    from policies.model import Quality, Reading, SensorKind  # noqa: PLC0415

    store = StateStore()
    node = SimpleNamespace(name="n1", rack="r1")
    stub: Any = SimpleNamespace()
    view = ServiceView(
        config=lambda: SimpleNamespace(node=node, policy=PolicyConfig()),  # type: ignore[arg-type,return-value]
        runners=list,
        store=store,
        engine=SimpleNamespace(last=None),  # type: ignore[arg-type]
        decisions=SimpleNamespace(latest=lambda node: None),  # type: ignore[arg-type]
        deliverer=SimpleNamespace(read_back={}),  # type: ignore[arg-type]
        overrides=stub,
        events=EventHub(),
        simulated=False,
    )

    clock = [1000.0]  # the cache's monotonic clock, moved by the test

    def reading(value: float) -> Reading:
        mono = clock[0]
        return Reading(
            "gpus",
            "gpu0.temperature",
            SensorKind.GPU_TEMPERATURE,
            value,
            "celsius",
            Quality.GOOD,
            mono,
            time.time(),
        )

    cache = StateBody(max_age_s=0.2, clock=lambda: clock[0])
    store.update("gpus", [reading(50.0)])
    first = cache.get(view)
    assert cache.get(view) is first  # same readings, fresh: served from the cache
    store.update("gpus", [reading(51.0)])
    second = cache.get(view)
    assert orjson.loads(second)["series"][0]["value"] == 51.0  # new readings: rebuilt
    clock[0] += 0.1
    assert cache.get(view) is second  # younger than max_age_s: still the cached body
    clock[0] += 0.15
    third = cache.get(view)
    assert third is not second  # aged out: ages recomputed
    assert orjson.loads(third)["series"][0]["age_s"] == pytest.approx(0.25)


async def test_sse_stream_survives_heartbeats_and_ids_from_before_a_restart(
    receiver: FakeWebhookScheduler,
    secret_file: Path,
    token_file: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import daemon.http.api  # noqa: PLC0415

    monkeypatch.setattr(daemon.http.api, "SSE_HEARTBEAT_S", 0.1)
    async with (
        running_daemon(
            fake_node(), receiver, secret_file, api_extra=f'token_file = "{token_file}"'
        ) as daemon_,
        aiohttp.ClientSession() as http,
    ):
        base = f"http://127.0.0.1:{daemon_.api_port}"
        # An id far above this process's: the client resumes from before a restart.
        async with http.get(f"{base}/v1/events", headers={"Last-Event-ID": "999999"}) as resp:
            early = await read_until(resp, lambda ev: True, heartbeats=3)
            await post(http, f"{base}/v1/overrides", {"action": "reset_storm", "reason": "hb"})
            got = early + await read_until(resp, lambda ev: len(overrides_in(ev)) == 1)
        assert overrides_in(got)[0][1]["reason"] == "hb"
        assert any(k == "assessment" for _, k, _ in got)  # the kept events were replayed


async def test_readyz_answers_at_once_when_another_process_holds_the_outbox_lock(
    receiver: FakeWebhookScheduler, secret_file: Path, tmp_path: Path
) -> None:
    import sqlite3  # noqa: PLC0415

    outbox = tmp_path / "outbox.sqlite3"
    async with (
        running_daemon(
            fake_node(), receiver, secret_file, scheduler_extra=f'outbox_path = "{outbox}"'
        ) as daemon_,
        aiohttp.ClientSession() as http,
    ):
        other = sqlite3.connect(outbox, isolation_level=None)  # e.g. an operator's sqlite3
        other.execute("BEGIN IMMEDIATE")
        try:
            # The store probes on its writer thread; /readyz itself never touches the disk.
            await wait_until(lambda: "locked" in daemon_.decisions.error)
            t0 = time.monotonic()
            body = await get(http, f"http://127.0.0.1:{daemon_.api_port}/readyz", status=503)
            assert time.monotonic() - t0 < 1.0  # not the 5 s busy timeout
            assert body["outbox"]["writable"] is False and "locked" in body["outbox"]["error"]
            assert any("locked" in p for p in body["problems"])
        finally:
            other.execute("ROLLBACK")
            other.close()
        await wait_until(lambda: not daemon_.decisions.error)
        assert (await get(http, f"http://127.0.0.1:{daemon_.api_port}/readyz"))["ready"]
