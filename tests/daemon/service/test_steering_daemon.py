"""Steering wired into the running daemon: its task, GET /v1/steering, the metric, the
outbox row, and a restore at start when the config says enabled = false."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import orjson
import pytest

from adapters.sensors.nvml import NvmlAdapter
from daemon.config import parse_config
from daemon.delivery.outbox import DecisionStore
from daemon.service.app import Daemon
from fakes.kube_api import FakeKubeApi
from fakes.nvml import fake_node
from tests.support.openapi import check
from tests.support.secrets import write_secret
from tests.support.wait import wait_until

LABEL = "rackguard.io/thermal-headroom"
NODE = "gpu-node-07"


@pytest.fixture
async def api() -> AsyncIterator[FakeKubeApi]:
    fake = FakeKubeApi()
    fake.add_node(NODE)
    await fake.start()
    yield fake
    await fake.stop()


def config(api: FakeKubeApi, tmp_path: Path, *, enabled: bool) -> str:
    token = tmp_path / "token"
    write_secret(token, "test-token\n")
    return f"""
[node]
name = "{NODE}"
[api]
port = 0
[sources.gpus]
type = "nvml"
interval_s = 0.05
timeout_s = 0.04
[policy]
evaluate_interval_s = 0.05
[scheduler]
type = "kubernetes"
api_url = "{api.url}"
token_file = "{token}"
outbox_path = "{tmp_path / "outbox.sqlite3"}"
reconcile_interval_s = 0
[cluster]
view_interval_s = 0
[steering]
enabled = {str(enabled).lower()}
interval_s = 0.05
"""


async def run(daemon: Daemon) -> asyncio.Task[None]:
    task = asyncio.create_task(daemon.run(handle_signals=False))
    await asyncio.wait_for(daemon.ready.wait(), 5)
    return task


async def get(daemon: Daemon, path: str) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as s,
        s.get(f"http://127.0.0.1:{daemon.api_port}{path}") as resp,
    ):
        return resp.status, await resp.text()


async def test_the_daemon_steers_through_its_sink_and_reports_it(
    api: FakeKubeApi, tmp_path: Path
) -> None:
    path = tmp_path / "rackguard.toml"
    path.write_text(config(api, tmp_path, enabled=True))
    cfg = parse_config(path.read_text())
    nvml = fake_node()
    daemon = Daemon(cfg, adapters={"gpus": NvmlAdapter("gpus", nvml)}, config_path=path)
    assert daemon.steering is not None
    task = await run(daemon)
    try:
        # A fresh node has no resistance estimate yet: nothing is written.
        steering = daemon.steering
        await wait_until(lambda: steering.state != "disabled", what="a first steering step")
        status, body = await get(daemon, "/v1/steering")
        assert status == 200
        data = orjson.loads(body)
        check("SteeringStatus", data)
        assert data["state"] == "untrusted" and data["target"] == f"kubernetes label {LABEL}"
        _, metrics = await get(daemon, "/metrics")
        assert 'rackguard_steering_writes_total{result="written"} 0.0' in metrics
        assert LABEL not in api.nodes[NODE]["metadata"]["labels"]
        # A reload switches it off (and keeps the [cluster] table it does not reload).
        path.write_text(config(api, tmp_path, enabled=False))
        assert await daemon.reload()
        assert daemon.config.steering.enabled is False and daemon.config.cluster == cfg.cluster
        await wait_until(lambda: steering.state == "disabled", what="steering disabled")
    finally:
        daemon.stop()
        await asyncio.wait_for(task, 5)


async def test_disabled_at_start_restores_what_rackguard_wrote(
    api: FakeKubeApi, tmp_path: Path
) -> None:
    # A previous run steered the label from "legacy" to "3".
    api.edit_node(NODE, {"metadata": {"labels": {LABEL: "3"}}})
    store = DecisionStore(tmp_path / "outbox.sqlite3")
    await store.write(
        lambda db: db.execute(
            "INSERT INTO steering VALUES (?, ?, ?, ?, ?, ?, ?)",
            (NODE, f"kubernetes label {LABEL}", "legacy", "3", None, 1.0, 3),
        )
    )
    store.close()
    cfg = parse_config(config(api, tmp_path, enabled=False))
    daemon = Daemon(cfg, adapters={"gpus": NvmlAdapter("gpus", fake_node())})
    task = await run(daemon)
    try:
        await wait_until(
            lambda: api.nodes[NODE]["metadata"]["labels"].get(LABEL) == "legacy",
            what="the original label restored",
        )
        await wait_until(lambda: daemon.steering is not None and daemon.steering.row is None)
    finally:
        daemon.stop()
        await asyncio.wait_for(task, 5)
    reopened = DecisionStore(tmp_path / "outbox.sqlite3")
    try:
        assert reopened.steering_at_open == []
    finally:
        reopened.close()
