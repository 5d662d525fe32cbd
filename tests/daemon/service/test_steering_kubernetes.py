"""Steering as a Kubernetes node label, against the fake API server over HTTP.

The label follows the headroom's bucket, at most once per interval and with
hysteresis; a label someone else changed is left alone (and said once); the
original is restored when steering is disabled; a drained node, a busy outbox
and an untrusted estimate write nothing; what rackguard wrote survives a restart.
In the running daemon: its task, GET /v1/steering, the metric, a reload that
disables it, and a restore at start.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import kubernetes_validate
import orjson
import pytest
import yaml

from adapters.schedulers.kubernetes.backend import KubernetesBackend
from adapters.schedulers.kubernetes.client import KubeClient, connection
from adapters.sensors.nvml import NvmlAdapter
from daemon.app import Daemon
from daemon.config import parse_config
from daemon.config.steering import SteeringConfig
from daemon.delivery.outbox import DecisionStore
from daemon.http.bodies import to_wire
from daemon.http.steering import SteeringCollector
from daemon.service.steering import Steering
from fakes.kube_api import FakeKubeApi
from fakes.nvml import fake_node
from tests.support.faulty_disk import FlakyDisk
from tests.support.openapi import check
from tests.support.paths import ROOT
from tests.support.secrets import write_secret
from tests.support.steering import Knobs, steering
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


@pytest.fixture
async def backend(api: FakeKubeApi, tmp_path: Path) -> AsyncIterator[KubernetesBackend]:
    token = tmp_path / "token"
    write_secret(token, "test-token\n")
    b = KubernetesBackend(KubeClient(connection(api_url=api.url, token_file=token)))
    yield b
    await b.sink().close()


def label(api: FakeKubeApi) -> str | None:
    value = api.nodes[NODE]["metadata"].get("labels", {}).get(LABEL)
    return str(value) if value is not None else None


def label_patches(api: FakeKubeApi) -> int:
    return sum(1 for _, _, body in api.patches if LABEL.replace("/", "~1") in str(body))


async def test_the_label_follows_the_bucket_once_per_interval(
    api: FakeKubeApi, steer: Steering, knobs: Knobs
) -> None:
    knobs.margin(17.0)
    await steer.step()
    assert label(api) == "3" and steer.state == "steered"
    # Less headroom at once: no second write within min_interval_s.
    knobs.later(60)
    knobs.margin(7.0)
    await steer.step()
    assert label(api) == "3" and steer.state == "rate_limited"
    knobs.later(300)
    await steer.step()
    assert label(api) == "1" and label_patches(api) == 2
    assert steer.writes["written"] == 2


async def test_a_margin_at_an_edge_does_not_flap(
    api: FakeKubeApi, steer: Steering, knobs: Knobs
) -> None:
    knobs.margin(10.2)  # bucket 2 (10 to 15)
    await steer.step()
    assert label(api) == "2"
    for margin in (9.6, 10.4, 9.2, 10.9, 9.1):  # within the 1 C hysteresis of the edge
        knobs.later(400)
        knobs.margin(margin)
        await steer.step()
        assert label(api) == "2", margin
    knobs.later(400)
    knobs.margin(8.9)  # past it
    await steer.step()
    assert label(api) == "1" and label_patches(api) == 2
    for margin in (10.1, 10.9):  # up again: past the edge, not past it by the hysteresis
        knobs.later(400)
        knobs.margin(margin)
        await steer.step()
        assert label(api) == "1", margin
    knobs.later(400)
    knobs.margin(11.1)
    await steer.step()
    assert label(api) == "2" and label_patches(api) == 3


async def test_a_label_changed_by_someone_else_is_left_alone_and_said_once(
    api: FakeKubeApi, steer: Steering, knobs: Knobs, caplog: pytest.LogCaptureFixture
) -> None:
    knobs.margin(17.0)
    await steer.step()
    api.edit_node(NODE, {"metadata": {"labels": {LABEL: "pinned-by-ops"}}})
    caplog.set_level(logging.WARNING)
    for _ in range(3):
        knobs.later(400)
        knobs.margin(3.0)
        await steer.step()
    assert label(api) == "pinned-by-ops"
    assert steer.state == "foreign" and "someone else" in steer.detail
    warned = [r for r in caplog.records if "someone else" in r.getMessage()]
    assert len(warned) == 1 and NODE in warned[0].getMessage()
    status = to_wire(steer.status())
    check("SteeringStatus", status)
    assert status["state"] == "foreign" and status["value"] == "pinned-by-ops"
    # Set back to the original (absent): rackguard's to steer again.
    api.edit_node(NODE, {"metadata": {"labels": {LABEL: None}}})
    knobs.later(400)
    await steer.step()
    assert label(api) == "0" and steer.state == "steered"


async def test_a_change_between_read_and_write_is_not_overwritten(
    api: FakeKubeApi, steer: Steering, knobs: Knobs
) -> None:
    knobs.margin(17.0)
    await steer.step()
    knobs.later(400)
    knobs.margin(3.0)
    api.race_next_patch = 1  # another controller changes the node just before our PATCH
    await steer.step()
    # The JSON Patch tested the label, not the whole node: an unrelated change does not
    # stop it; the value rackguard expected was still there.
    assert label(api) == "0"
    # Now someone relabels the node between rackguard's read and its PATCH.
    knobs.later(400)
    knobs.margin(17.0)
    api.before_next_patch = lambda name: api.edit_node(
        name, {"metadata": {"labels": {LABEL: "ops"}}}
    )
    await steer.step()
    assert label(api) == "ops" and steer.state == "foreign"
    knobs.later(400)
    await steer.step()  # read back: the same change, not a second one
    assert label(api) == "ops" and steer.writes["foreign"] == 1


async def test_disabled_restores_the_original(
    api: FakeKubeApi, steer: Steering, knobs: Knobs
) -> None:
    api.edit_node(NODE, {"metadata": {"labels": {LABEL: "legacy"}}})
    knobs.margin(17.0)
    await steer.step()
    assert label(api) == "3"
    knobs.set(enabled=False)
    await steer.step()
    assert label(api) == "legacy" and steer.row is None and steer.writes["restored"] == 1
    await steer.step()  # nothing left to restore
    assert label(api) == "legacy" and steer.state == "disabled"


async def test_disabled_removes_a_label_that_was_absent(
    api: FakeKubeApi, steer: Steering, knobs: Knobs
) -> None:
    knobs.margin(12.0)
    await steer.step()
    assert label(api) == "2"
    knobs.set(enabled=False)
    await steer.step()
    assert LABEL not in api.nodes[NODE]["metadata"]["labels"]


async def test_untrusted_held_or_busy_writes_nothing(
    api: FakeKubeApi, steer: Steering, knobs: Knobs
) -> None:
    knobs.margin(17.0, trusted=False)
    await steer.step()
    assert steer.state == "untrusted" and "3 of 4" in steer.detail
    knobs.margin(17.0)
    knobs.held = True
    await steer.step()
    assert steer.state == "held"
    knobs.held, knobs.busy = False, True
    await steer.step()
    assert steer.state == "waiting"
    assert label(api) is None and api.patches == []


async def test_what_was_written_survives_a_restart(
    api: FakeKubeApi, backend: KubernetesBackend, tmp_path: Path, knobs: Knobs
) -> None:
    store = DecisionStore(tmp_path / "o.sqlite3")
    first = steering(NODE, backend, store, knobs)
    api.edit_node(NODE, {"metadata": {"labels": {LABEL: "legacy"}}})
    knobs.margin(17.0)
    await first.step()
    store.close()
    store = DecisionStore(tmp_path / "o.sqlite3")
    try:
        again = steering(NODE, backend, store, knobs)
        assert again.row is not None and again.row.original == "legacy"
        assert again.row.written == "3" and again.row.bucket == 3
        # Its own value is not "someone else's", and disabling still restores.
        knobs.set(enabled=False)
        await again.step()
        assert label(api) == "legacy"
    finally:
        store.close()


async def test_an_unreachable_api_is_logged_once_and_retried(
    api: FakeKubeApi, steer: Steering, knobs: Knobs, caplog: pytest.LogCaptureFixture
) -> None:
    knobs.margin(17.0)
    api.token = "rotated"  # every request is now 401
    caplog.set_level(logging.DEBUG)
    await steer.step()
    await steer.step()
    assert steer.state == "failed" and steer.writes["failed"] == 2
    warned = [r for r in caplog.records if r.levelno == logging.WARNING and "steering" in r.msg]
    assert len(warned) == 1
    api.token = "test-token"
    await steer.step()
    assert label(api) == "3" and steer.state == "steered"


async def test_an_unreachable_api_is_retried_less_often_up_to_min_interval(
    api: FakeKubeApi, steer: Steering, knobs: Knobs
) -> None:
    """10,000 agents retrying a controller coming back every 30 s is 333 requests/s."""
    knobs.margin(17.0)
    api.token = "rotated"  # every request is now 401
    poller = steer.poller
    waits = []
    for _ in range(6):
        assert not await poller.attempt()  # the step's failure reaches the poller
        waits.append(poller.backoff_s(poller.stats.consecutive_failures))
    interval, most = knobs.config.interval_s, knobs.config.min_interval_s
    assert 0.8 * interval <= waits[0] <= 1.2 * interval
    assert waits[3] >= 0.8 * 8 * interval  # doubling
    assert waits[-1] <= 1.2 * most and waits[-1] >= 0.8 * most  # capped at min_interval_s
    api.token = "test-token"
    assert await poller.attempt()
    assert poller.stats.consecutive_failures == 0 and label(api) == "3"


def test_the_documented_affinity_is_a_valid_pod_on_the_label() -> None:
    """docs/schedulers.md's example: a Pod Kubernetes accepts, preferring rackguard's buckets."""
    text = (ROOT / "docs" / "schedulers.md").read_text()
    block = text.split("<!-- steering-affinity -->\n```yaml\n", 1)[1].split("```", 1)[0]
    pod = yaml.safe_load(block)
    kubernetes_validate.validate(pod, kubernetes_validate.latest_version(), strict=True)
    prefs = pod["spec"]["affinity"]["nodeAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    buckets = {str(b) for b in range(len(SteeringConfig().edges_c) + 1)}
    for pref in prefs:
        (expr,) = pref["preference"]["matchExpressions"]
        assert expr["key"] == SteeringConfig().label_key
        assert set(expr["values"]) <= buckets


async def test_no_write_while_the_disk_refuses_to_keep_the_original(
    api: FakeKubeApi, backend: KubernetesBackend, tmp_path: Path, knobs: Knobs
) -> None:
    """The original must be durable before the first write: a full disk writes nothing."""
    store = DecisionStore(tmp_path / "o.sqlite3")
    disk = FlakyDisk(store._db)
    store._db = disk  # type: ignore[assignment]
    try:
        steer = steering(NODE, backend, store, knobs)
        api.edit_node(NODE, {"metadata": {"labels": {LABEL: "legacy"}}})
        knobs.margin(17.0)
        disk.full = True
        await steer.step()
        assert label(api) == "legacy" and steer.state == "failed" and steer.row is None
        assert "disk is full" in steer.detail
        disk.full = False
        await steer.step()
        assert label(api) == "3" and steer.row is not None and steer.row.original == "legacy"
    finally:
        store._db = disk._db
        store.close()


# ---------------------------------------------------------------- in the running daemon


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
interval_s = 10
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
        check("NodeSteering", data)
        assert data["node"] == NODE
        state = data["steering"]
        assert state["state"] == "untrusted" and state["target"] == f"kubernetes label {LABEL}"
        _, metrics = await get(daemon, "/metrics")
        assert 'rackguard_steering_writes_total{result="written"} 0.0' in metrics
        assert LABEL not in api.nodes[NODE]["metadata"]["labels"]
        # A reload switches it off (and keeps the [cluster] table it does not reload).
        path.write_text(config(api, tmp_path, enabled=False))
        assert await daemon.reload()
        assert daemon.config.steering.enabled is False and daemon.config.cluster == cfg.cluster
        await steering.step()  # the next interval's step, not 10 s from now
        assert steering.state == "disabled"
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


async def test_a_value_already_in_place_is_not_written_and_is_reported(
    api: FakeKubeApi, steer: Steering, knobs: Knobs
) -> None:
    api.edit_node(NODE, {"metadata": {"labels": {LABEL: "3"}}})
    knobs.margin(16.5)
    await steer.step()
    assert api.patches == [] and steer.row is None and steer.state == "steered"
    metrics = {m.name: m for m in SteeringCollector(steer).collect()}
    assert metrics["rackguard_steering_bucket"].samples[0].value == 3
    assert {s.labels["result"]: s.value for s in metrics["rackguard_steering_writes"].samples} == {
        "written": 0,
        "restored": 0,
        "foreign": 0,
        "failed": 0,
    }
    # The bucket in place holds the hysteresis even with nothing written: 14.5 stays 3.
    knobs.later(400)
    knobs.margin(14.5)
    await steer.step()
    assert api.patches == [] and steer.status().bucket == 3
