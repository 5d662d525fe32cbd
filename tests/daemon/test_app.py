"""The daemon whole: API, readings to decision to scheduler, start-up errors, signals."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import aiohttp
import pytest

from adapters.schedulers.webhook.sink import WebhookSink
from daemon.delivery.outbox import DecisionStore
from daemon.service.runner import Health
from fakes.nvml import FakeNvml, fake_node
from fakes.scheduler import FakeWebhookScheduler
from policies.model import Decision
from tests.support.daemon_harness import (
    SIMULATED_RACKGUARD,
    config_text,
    running,
    running_daemon,
)
from tests.support.paths import ROOT
from tests.support.secrets import WEBHOOK_SECRET as SECRET
from tests.support.secrets import write_secret
from tests.support.stray_cancel import CancelledWithResult, reply_racing_the_cancel
from tests.support.wait import wait_until, wait_until_sync


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    path = tmp_path / "key"
    write_secret(path, SECRET)
    return path


async def test_hot_gpu_is_drained_then_resumed_and_api_shows_state(
    receiver: FakeWebhookScheduler, secret: Path
) -> None:
    nvml = fake_node()
    for g in nvml.gpus:
        g.temperature_c = 60.0
    async with running_daemon(nvml, receiver, secret) as daemon:
        base = f"http://127.0.0.1:{daemon.api_port}"
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base}/healthz") as resp:
                assert resp.status == 200 and (await resp.json())["status"] == "ok"
            async with http.get(f"{base}/v1/state") as resp:
                body = await resp.json()
            assert body["node"] == "gpu-node-07"
            assert body["sources"]["gpus"]["health"] == "up"
            temps = {s["sensor"]: s for s in body["series"] if s["kind"] == "gpu_temperature"}
            assert len(temps) == 8
            assert temps["gpu0.temperature"]["value"] == 60.0
            assert temps["gpu0.temperature"]["quality"] == "good"
            assert 0 <= temps["gpu0.temperature"]["age_s"] < 1.0
            async with http.get(f"{base}/v1/nope") as resp:
                assert resp.status == 404
                assert (await resp.json())["error"]["code"] == "not_found"

            nvml.gpus[5].temperature_c = 87.0  # 3C under the H100's 90C slowdown
            await wait_until(lambda: receiver.node_state.get("gpu-node-07") == "drained")
            (drain,) = receiver.received
            assert drain.payload["reason"] == "rackguard: gpu5 87C near slowdown 90C"
            assert drain.payload["domain"] == "gpu"

            nvml.gpus[5].temperature_c = 60.0
            await wait_until(lambda: receiver.node_state.get("gpu-node-07") == "idle")
            assert [r.payload["action"] for r in receiver.received] == ["drain", "resume"]


class StrayCancelSink(WebhookSink):
    """Its first delivery ends in a client library's own CancelledError; the rest go through."""

    strayed = False

    async def deliver(self, decision: Decision) -> None:
        if not self.strayed:
            self.strayed = True
            raise CancelledWithResult()
        await super().deliver(decision)


async def test_a_loop_ended_by_a_cancellation_no_one_asked_for_is_restarted(
    receiver: FakeWebhookScheduler, secret: Path, caplog: pytest.LogCaptureFixture
) -> None:
    nvml = fake_node()
    for g in nvml.gpus:
        g.temperature_c = 60.0
    sink = StrayCancelSink(receiver.url, SECRET)
    async with running(config_text(receiver.url, secret), nvml, sink=sink):
        nvml.gpus[5].temperature_c = 87.0
        # Before: the delivery task ended, its TaskGroup dropped it without a word, and
        # the drain (and every decision after it) stayed undelivered while /healthz said ok.
        await wait_until(lambda: receiver.node_state.get("gpu-node-07") == "drained", timeout=5)
    assert sink.strayed
    restarts = [r for r in caplog.records if "no one asked for" in r.getMessage()]
    assert [(r.levelno, r.getMessage().split(" ended by ")[0]) for r in restarts] == [
        (logging.ERROR, "gpu-node-07: delivery loop")
    ]


class HangingCloseSink(WebhookSink):
    """Its close() hangs, and ends in a client library's CancelledError when given up on."""

    async def close(self) -> None:
        await reply_racing_the_cancel(3600)


async def test_a_stop_past_its_grace_still_closes_the_outbox(
    receiver: FakeWebhookScheduler, secret: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("daemon.app.STOP_GRACE_S", 0.2)
    sink = HangingCloseSink(receiver.url, SECRET)
    # Before: the library's CancelledError at the grace limit ended the stop there,
    # the outbox left open and its lock held, the process ending with a traceback.
    async with running(config_text(receiver.url, secret), fake_node(), sink=sink) as daemon:
        pass
    DecisionStore(daemon.decisions.path).close()  # the lock is free: a next start can open it


async def test_bad_sensor_becomes_bad_reading_never_a_decision(
    receiver: FakeWebhookScheduler, secret: Path
) -> None:
    nvml = fake_node()
    nvml.gpus[2].errors["nvmlDeviceGetTemperature"] = 999  # NVML_ERROR_UNKNOWN
    async with running_daemon(nvml, receiver, secret) as daemon:
        first = daemon.engine.last
        # Until the bad reading is stored and an evaluation after it has run.
        await wait_until(
            lambda: (
                "gpus/gpu2.temperature" in daemon.store.latest()
                and daemon.engine.last not in (None, first)
            ),
            what="an evaluation after the bad reading",
        )
        bad = daemon.store.latest()["gpus/gpu2.temperature"]
        assert bad.value is None and "UNKNOWN" in bad.reason.upper()
        assert daemon.engine.last is not None
        assert daemon.engine.last.node.condition.value == "unknown"
        assert list(daemon.engine.decisions) == []  # decided nothing, so sent nothing
        assert receiver.received == []


async def test_hung_nvml_marks_source_down_and_daemon_stays_responsive(
    receiver: FakeWebhookScheduler, secret: Path
) -> None:
    nvml = FakeNvml(fake_node().gpus)
    async with running_daemon(nvml, receiver, secret) as daemon:
        nvml.gpus[0].delay_s = 1.5  # the driver hangs
        (runner,) = daemon.runners
        await wait_until(lambda: runner.health is Health.DOWN, 5)
        async with aiohttp.ClientSession() as http:
            t0 = time.monotonic()
            async with http.get(f"http://127.0.0.1:{daemon.api_port}/v1/state") as resp:
                body = await resp.json()
            assert time.monotonic() - t0 < 0.5
        assert body["sources"]["gpus"]["health"] == "down"
        nvml.gpus[0].delay_s = 0.0
        await wait_until(lambda: runner.health is Health.UP, 10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as resp:
            return bool(resp.status == 200)
    except OSError:  # HTTPError (503: not yet) is an OSError
        return False


def _gpus_up(port: int) -> bool:
    """/readyz is 200 and the GPUs source is up (a first poll late on a busy host is a
    failed report, which /readyz counts: the source is up only once it answers)."""
    if not _ready(port):
        return False
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/state", timeout=1) as resp:
            return bool(json.loads(resp.read())["sources"]["gpus"]["health"] == "up")
    except OSError:
        return False


def test_process_stops_cleanly_on_sigterm(tmp_path: Path, secret: Path) -> None:
    port = free_port()
    cfg = tmp_path / "rg.toml"
    cfg.write_text(config_text("http://127.0.0.1:9/none", secret, port=port))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [*SIMULATED_RACKGUARD, "run", "--config", str(cfg)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
                assert time.monotonic() < deadline, "daemon did not start listening"
                time.sleep(0.05)
        # Stopped once fully started (every source reported), not mid-start-up.
        wait_until_sync(lambda: _gpus_up(port), 15, "GET /readyz 200, gpus up")
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=5)
        elapsed = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = proc.stdout.read() if proc.stdout else ""
    assert rc == 0, out
    assert elapsed < 5.0
    assert "SIGTERM received, stopping" in out
    assert re.search(r"gpus: source (up|recovered)", out), out


def nvml_usable() -> bool:
    """Whether this machine has a working NVIDIA driver."""
    import pynvml  # noqa: PLC0415

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


def test_process_start_fails_clearly_without_nvml_library(tmp_path: Path, secret: Path) -> None:
    cfg = tmp_path / "rg.toml"
    cfg.write_text(config_text("http://127.0.0.1:9/none", secret))
    proc = subprocess.run(
        [sys.executable, "-m", "daemon.cli", "run", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    if nvml_usable():
        pytest.skip("a real NVIDIA driver is present: the no-library start-up path cannot be shown")
    assert proc.returncode == 1
    assert "cannot start" in proc.stderr and "libnvidia-ml.so.1" in proc.stderr


def test_probe_prints_one_read_as_table(tmp_path: Path, secret: Path) -> None:
    cfg = tmp_path / "rg.toml"
    cfg.write_text(config_text("http://127.0.0.1:9/none", secret))
    proc = subprocess.run(
        [*SIMULATED_RACKGUARD, "probe", "gpus", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT), "RACKGUARD_FAKE_GPUS": "2"},
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["SENSOR", "VALUE", "UNIT", "QUALITY", "DETAIL"]
    assert sum(1 for line in lines if line.startswith("gpu1.")) == 9  # with the violation counter
    assert any(line.split()[:3] == ["gpu0.slowdown_threshold", "90", "celsius"] for line in lines)
