"""The cap decisions applied through DirectNvmlLimiter on the fake NVML, durable in the store."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from msgspec import UNSET, UnsetType
from prometheus_client import CollectorRegistry, generate_latest

from adapters.schedulers.webhook.sink import WebhookSink
from adapters.sensors.nvml import NvmlAdapter
from adapters.sensors.power_limit import DirectNvmlLimiter
from daemon.app import Daemon
from daemon.config import parse_config
from daemon.delivery.outbox import DecisionStore
from daemon.http.cap_ladder_metrics import CapLadderCollector
from daemon.http.decision_log import LogQuery, page
from daemon.service.power_cap import PowerCaps
from daemon.service.power_limit import WatchedLimiter
from fakes.nvml import fake_node
from fakes.scheduler import FakeWebhookScheduler
from policies.power_cap import (
    REFUSED_RETRY_MAX_S,
    CapAction,
    CapDecision,
    CapLadder,
    CapState,
)
from tests.support.daemon_harness import config_text
from tests.support.openapi import check
from tests.support.scrape import scrape_text
from tests.support.secrets import WEBHOOK_SECRET as SECRET
from tests.support.wait import wait_until

NODE = "gpu-node-02"


def _caps(store: DecisionStore, fake: object) -> PowerCaps:
    limiter = WatchedLimiter(DirectNvmlLimiter(fake, name="power-cap"))
    return PowerCaps(NODE, limiter, store, CapLadder())


def _scrape(caps: PowerCaps) -> str:
    registry = CollectorRegistry()
    registry.register(CapLadderCollector(caps))
    return generate_latest(registry).decode()


def _decision(action: CapAction, watts: float) -> CapDecision:
    return CapDecision(NODE, "3", action, watts, 700.0, "rackguard: test", 0.0, "k")


async def test_power_cap_survives_the_store_reopened_and_restores_to_before(
    tmp_path: Path,
) -> None:
    fake = fake_node(count=4)
    fake.privileged = True
    store = DecisionStore(tmp_path / "o.sqlite3")
    first = _caps(store, fake)
    await first.step()  # reads the limits: the ladder learns each GPU's constraints
    assert first.ladder.limits[(NODE, "3")].min_w == 200.0
    first.ladder.states[(NODE, "3")] = CapState(NODE, "3", 450.0, 700.0, 0.0, "margin")
    first.take([_decision(CapAction.CAP, 450.0)])
    await first.step()
    assert fake.gpus[3].power_limit_w == 450.0
    assert [r.set_by for r in first.status()] == ["", "", "", "rackguard"]
    await first.limiter.close()
    store.close()

    # A restart: the store reopened, a fresh ladder.
    store = DecisionStore(tmp_path / "o.sqlite3")
    try:
        again = _caps(store, fake)
        assert await again.load() == 1
        state = again.ladder.states[(NODE, "3")]
        assert (state.limit_w, state.before_w, state.cause) == (450.0, 700.0, "margin")
        await again.step()
        assert fake.gpus[3].power_limit_w == 450.0  # not set twice, not lost
        # The last restore step: back to the limit before, and the row is gone.
        del again.ladder.states[(NODE, "3")]
        again.take([_decision(CapAction.RESTORE, 700.0)])
        await again.step()
        assert fake.gpus[3].power_limit_w == 700.0
        assert await _caps(store, fake).load() == 0
        await again.limiter.close()
    finally:
        store.close()


async def test_power_cap_refused_limit_forgets_the_cap_so_the_drain_goes_ahead(
    tmp_path: Path,
) -> None:
    fake = fake_node(count=2)
    fake.privileged = False  # NVML_ERROR_NO_PERMISSION on the set
    store = DecisionStore(tmp_path / "o.sqlite3")
    try:
        caps = _caps(store, fake)
        await caps.step()
        caps.ladder.states[(NODE, "1")] = CapState(NODE, "1", 300.0, 700.0, 0.0, "margin")
        caps.take([CapDecision(NODE, "1", CapAction.CAP, 300.0, 700.0, "rackguard: t", 0.0, "k")])
        await caps.step()
        assert caps.ladder.states == {} and caps.failures == 1
        assert fake.gpus[1].power_limit_w == 700.0
        # No privilege is permanent: not asked again for the longest backoff.
        again = caps.ladder.refused_until(NODE, "1")
        assert again is not None and again >= time.monotonic() + 0.9 * REFUSED_RETRY_MAX_S
        assert await _caps(store, fake).load() == 0
        text = _scrape(caps)
        assert "rackguard_gpu_power_cap_failures_total 1.0" in text
        [(action, body)] = await store.query(
            lambda db: db.execute("SELECT action, body FROM cap_log").fetchall()
        )
        record = orjson.loads(body)
        assert action == "cap" and (record["watts"], record["set_by"]) == (300.0, "rackguard")
        assert "NVML_ERROR_NO_PERMISSION" in record["error"]  # refused: shown, not applied
        await caps.limiter.close()
    finally:
        store.close()


async def test_power_cap_capped_seconds_counted_for_rackguards_caps(tmp_path: Path) -> None:
    fake = fake_node(count=1)
    fake.privileged = True
    store = DecisionStore(tmp_path / "o.sqlite3")
    clock = [100.0]
    try:
        caps = PowerCaps(
            "n",
            WatchedLimiter(DirectNvmlLimiter(fake, name="power-cap")),
            store,
            CapLadder(),
            mono=lambda: clock[0],
        )
        await caps.step()
        caps.ladder.states[("n", "0")] = CapState("n", "0", 300.0, 700.0, 0.0, "loop")
        clock[0] = 112.5
        await caps.step()
        text = _scrape(caps)
        assert 'rackguard_gpu_capped_seconds_total{gpu="0"} 12.5' in text
        await caps.limiter.close()
    finally:
        store.close()


async def _get(port: int | None, path: str) -> Any:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}{path}") as r:
        assert r.status == 200
        return await r.json()


async def test_power_cap_daemon_restarted_over_its_cap_carries_on_then_sees_an_admin(
    tmp_path: Path,
) -> None:
    """A real daemon started over a cap of its own (the row and the limit from a run
    before): shown as rackguard's, not set again; an admin's change is left and shown."""
    fake = fake_node()
    fake.privileged = True
    for g in fake.gpus:
        g.temperature_c = 55.0
    outbox = tmp_path / "outbox.sqlite3"
    store = DecisionStore(outbox)
    before = _caps(store, fake)
    await before.step()
    before.ladder.states[(NODE, "2")] = CapState(NODE, "2", 450.0, 700.0, 0.0, "margin")
    before.take([CapDecision(NODE, "2", CapAction.CAP, 450.0, 700.0, "rackguard: t", 0.0, "k")])
    await before.step()
    await before.limiter.close()
    store.close()
    receiver = FakeWebhookScheduler(SECRET)
    url = await receiver.start()
    secret = tmp_path / "webhook.key"
    secret.write_bytes(SECRET)
    secret.chmod(0o600)
    text = config_text(url, secret) + (
        f'outbox_path = "{outbox}"\n[power_cap]\nenabled = true\nvia = "direct"\n'
    )
    text = text.replace('name = "gpu-node-07"', f'name = "{NODE}"')
    cfg = parse_config(text)
    sink = WebhookSink(url, SECRET)
    daemon = Daemon(cfg, adapters={"gpus": NvmlAdapter("gpus", fake)}, nvml=fake, sink=sink)
    task = asyncio.create_task(daemon.run(handle_signals=False))
    try:
        await asyncio.wait_for(daemon.ready.wait(), 5)
        await asyncio.sleep(0.5)
        body = await _get(daemon.api_port, "/v1/power-caps")
        assert body["enabled"] is True
        gpu2 = body["gpus"][2]
        assert (gpu2["set_by"], gpu2["cap_w"], gpu2["before_w"]) == ("rackguard", 450.0, 700.0)
        assert body["decisions"] == []  # carried on: not capped again
        fake.admin_set_limit(2, 500.0)
        await wait_until(
            lambda: daemon.power_caps is not None and bool(daemon.power_caps.decisions),
            what="the release",
        )
        await asyncio.sleep(0.3)
        body = await _get(daemon.api_port, "/v1/power-caps")
        assert [d["action"] for d in body["decisions"]] == ["release"]
        assert (body["gpus"][2]["set_by"], body["gpus"][2]["cap_w"]) == ("other", 500.0)
        assert fake.gpus[2].power_limit_w == 500.0  # left as the admin set it
        text_metrics = await scrape_text(daemon.api_port)
        assert 'rackguard_gpu_power_cap_set_by{gpu="2",set_by="other"} 1.0' in text_metrics
        # Seen everywhere: the decision log holds the cap (from the run before) and the
        # release, newest first; /v1/state shows the limit, the cap and who set it.
        log = await _get(daemon.api_port, "/v1/decisions?kind=cap")
        check("DecisionLog", log)  # the OpenAPI document's own schema
        rows = [(i["kind"], i["action"], i["cap"]["gpu"], i["cap"]["set_by"]) for i in log["items"]]
        assert rows == [("cap", "release", "2", "other"), ("cap", "cap", "2", "rackguard")]
        release, cap = (i["cap"] for i in log["items"])
        assert (release["watts"], release["before_w"], release["node"]) == (500.0, 700.0, NODE)
        assert (cap["watts"], cap["before_w"], cap["error"]) == (450.0, 700.0, "")
        assert "not rackguard's" in release["reason"]
        only = await _get(daemon.api_port, "/v1/decisions?action=release")
        assert [i["action"] for i in only["items"]] == ["release"]
        state = await _get(daemon.api_port, "/v1/state")
        check("State", state)
        gpu2 = state["power_caps"][2]
        assert (gpu2["gpu"], gpu2["enforced_w"], gpu2["cap_w"], gpu2["set_by"]) == (
            2, 500.0, 500.0, "other",
        )  # fmt: skip
        assert [g["set_by"] for g in state["power_caps"]].count("") == len(fake.gpus) - 1
    finally:
        daemon.stop()
        await asyncio.wait_for(task, 5)
        await receiver.stop()


async def test_power_cap_log_rows_paged_with_decisions_and_unreadable_ones_listed_bare(
    tmp_path: Path,
) -> None:
    store = DecisionStore(tmp_path / "o.sqlite3")
    try:
        rows = [
            (10.0, NODE, "cap", b'{"at":10.0,"gpu":"3","action":"cap","watts":450.0,'
             b'"reason":"rackguard: t","dry_run":false,"node":"gpu-node-02","future":1}'),
            (20.0, NODE, "restore", b'{"at":20.0,"gpu":"3","watts":"not watts"}'),
            (30.0, NODE, "release", b'{"at":30.0,"gpu":"3","action":"release","watts":500.0,'
             b'"reason":"rackguard: other","dry_run":false}'),
        ]  # fmt: skip
        await store.write(
            lambda db: db.executemany(
                "INSERT INTO cap_log (at, node, action, body) VALUES (?, ?, ?, ?)", rows
            )
        )
        first, cursor = await store.query(lambda db: page(db, LogQuery(kind="cap", limit=2)))
        assert [(i.action, i.at) for i in first] == [("release", 30.0), ("restore", 20.0)]
        assert first[1].cap is UNSET  # a row this version cannot read: listed, not a 500
        assert cursor is not None and cursor.endswith("_cap_2")
        rest, end = await store.query(lambda db: page(db, LogQuery(cursor=cursor)))
        assert [i.action for i in rest] == ["cap"] and end is None
        cap = rest[0].cap
        assert not isinstance(cap, UnsetType)  # an older row: the new fields defaulted
        assert (cap.watts, cap.set_by, cap.before_w, cap.error) == (450.0, "rackguard", 0.0, "")
    finally:
        store.close()
