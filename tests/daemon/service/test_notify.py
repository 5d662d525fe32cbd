"""sd_notify: READY, WATCHDOG, STATUS, STOPPING on a real socket; reload on SIGHUP."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from daemon.app import Daemon
from daemon.config import load_config
from daemon.service.notify import Notifier
from fakes.nvml_module import simulated_node
from fakes.scheduler import FakeWebhookScheduler
from tests.support.daemon_harness import SIMULATED_RACKGUARD
from tests.support.paths import ROOT
from tests.support.secrets import WEBHOOK_SECRET, write_secret
from tests.support.wait import wait_until, wait_until_sync


def write_config(path: Path, secret: Path, *, interval: float = 0.1, extra: str = "") -> None:
    path.write_text(f"""
[node]
name = "n-notify"
[api]
port = 0
[sources.gpus]
type = "nvml"
interval_s = {interval}
timeout_s = {interval / 2}
[scheduler]
type = "webhook"
url = "http://127.0.0.1:9/none"
secret_file = "{secret}"
{extra}
""")


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(0.2)
    yield sock, path
    sock.close()


def drain(sock: socket.socket, until: float) -> list[tuple[float, str]]:
    got = []
    while time.monotonic() < until:
        try:
            data = sock.recv(4096)
        except TimeoutError:
            continue
        got.append((time.monotonic(), data.decode()))
    return got


def drain_until_ready(sock: socket.socket, until: float) -> list[tuple[float, str]]:
    got: list[tuple[float, str]] = []
    while time.monotonic() < until and not any("READY=1" in m for _, m in got):
        got += drain(sock, min(until, time.monotonic() + 0.1))
    return got


def test_real_process_reports_ready_watchdog_status_stopping(
    tmp_path: Path, secret_file: Path, notify_socket: tuple[socket.socket, str]
) -> None:
    sock, path = notify_socket
    cfg = tmp_path / "rg.toml"
    write_config(cfg, secret_file)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NOTIFY_SOCKET": path, "WATCHDOG_USEC": "300000"}
    proc = subprocess.Popen(
        [*SIMULATED_RACKGUARD, "run", "--config", str(cfg)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        # Start-up time is the host's (imports on a busy machine): the watchdog window
        # is counted from READY=1, as systemd counts it.
        messages = drain_until_ready(sock, time.monotonic() + 30.0)
        messages += drain(sock, time.monotonic() + 3.0)
        proc.send_signal(signal.SIGTERM)
        messages += drain(sock, time.monotonic() + 2.0)
        assert proc.wait(timeout=5) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    texts = [m for _, m in messages]
    ready = [m for m in texts if "READY=1" in m]
    assert len(ready) == 1, texts
    assert "STATUS=n-notify (SIMULATED GPUs): " in ready[0] and "gpus up" in ready[0]
    ready_at = next(t for t, m in messages if "READY=1" in m)
    pings = [t for t, m in messages if m == "WATCHDOG=1" and t > ready_at]
    assert len(pings) >= 8, texts  # every 0.15 s for 3 s after READY (20 expected)
    assert texts[-1] == "STOPPING=1"


async def test_blocked_event_loop_stops_the_watchdog_pings(
    tmp_path: Path, secret_file: Path, notify_socket: tuple[socket.socket, str]
) -> None:
    sock, path = notify_socket
    sock.setblocking(False)
    cfg = tmp_path / "rg.toml"
    write_config(cfg, secret_file)
    notifier = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "100000"})
    daemon = Daemon(load_config(cfg), notifier=notifier, nvml=simulated_node())
    task = asyncio.create_task(daemon.run(handle_signals=False))
    pings: list[float] = []

    def collect() -> None:
        while True:
            try:
                if sock.recv(4096) == b"WATCHDOG=1":
                    pings.append(time.monotonic())
            except BlockingIOError:
                return

    def count() -> int:
        collect()
        return len(pings)

    try:
        await asyncio.wait_for(daemon.ready.wait(), 5)
        await wait_until(lambda: count() >= 5, 5, "5 watchdog pings")
        before = len(pings)
        blocked_at = time.monotonic()
        time.sleep(1.0)  # noqa: ASYNC251 - deliberately block the loop, as a hang would
        collect()
        assert not [p for p in pings if p > blocked_at], "pings continued while blocked"
        # Pings resume once the loop runs again.
        await wait_until(lambda: count() > before, 5, "a ping after the block")
    finally:
        daemon.stop()
        await asyncio.wait_for(task, 5)


async def test_sighup_reload_applies_new_sources_and_refuses_bad_config(
    tmp_path: Path, secret_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = tmp_path / "rg.toml"
    write_config(cfg, secret_file, interval=0.1)
    nvml = simulated_node()
    daemon = Daemon(load_config(cfg), config_path=cfg, nvml=nvml)
    task = asyncio.create_task(daemon.run(handle_signals=False))
    try:
        await asyncio.wait_for(daemon.ready.wait(), 5)
        readings_before = len(daemon.store.latest())
        assert readings_before == 72  # 8 GPUs x 9 series

        write_config(cfg, secret_file, interval=0.2, extra="[policy]\nenter_margin_c = 7.0\n")
        assert await daemon.reload()
        (runner,) = daemon.runners
        assert runner.timing.interval_s == 0.2
        assert daemon.engine.settings.enter_margin_c == 7.0
        assert len(daemon.store.latest()) == readings_before  # state kept
        await wait_until(lambda: runner.stats.attempts >= 1, what="the new runner's first poll")

        cfg.write_text(cfg.read_text().replace("interval_s = 0.2", "interval_s = 'x'"))
        assert not await daemon.reload()
        assert "reload of" in caplog.text and "sources.gpus.interval_s" in caplog.text
        assert daemon.config.sources["gpus"].interval_s == 0.2  # still running the old one
    finally:
        daemon.stop()
        await asyncio.wait_for(task, 5)


def test_real_process_reloads_on_sighup(tmp_path: Path, secret_file: Path) -> None:
    cfg = tmp_path / "rg.toml"
    write_config(cfg, secret_file)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    log = tmp_path / "rackguard.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*SIMULATED_RACKGUARD, "run", "--config", str(cfg)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=out,
        )

    def logged(text: str) -> bool:
        assert proc.poll() is None, log.read_text()  # SIGHUP does not kill it
        return text in log.read_text()

    try:
        wait_until_sync(lambda: logged(": ready: "), 30, what="ready")
        write_config(cfg, secret_file, interval=0.3)
        proc.send_signal(signal.SIGHUP)
        wait_until_sync(lambda: logged("gpus: source (re)started by reload"), 30, what="reload")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = log.read_text()
    assert "SIGHUP received, reloading configuration" in err
    assert "configuration reloaded from" in err


def test_notifier_is_silent_outside_systemd() -> None:
    n = Notifier({})
    assert not n.enabled and n.watchdog_s is None
    n.ready("x")  # no socket: nothing happens, nothing raises
    assert Notifier({"WATCHDOG_USEC": "500000", "WATCHDOG_PID": "1"}).watchdog_s is None
    assert Notifier({"WATCHDOG_USEC": "500000"}).watchdog_s == 0.5


async def test_overlapping_reloads_apply_one_at_a_time(tmp_path: Path, secret_file: Path) -> None:
    cfg = tmp_path / "rg.toml"
    write_config(cfg, secret_file, interval=0.1)
    nvml = simulated_node()
    daemon = Daemon(load_config(cfg), config_path=cfg, nvml=nvml)
    task = asyncio.create_task(daemon.run(handle_signals=False))
    try:
        await asyncio.wait_for(daemon.ready.wait(), 5)
        write_config(cfg, secret_file, interval=0.2)
        first, second = await asyncio.gather(daemon.reload(), daemon.reload())
        assert first and second  # two SIGHUPs close together once crashed the daemon
        assert [r.name for r in daemon.runners] == ["gpus"]
        assert daemon.runners[0].timing.interval_s == 0.2
    finally:
        daemon.stop()
        await asyncio.wait_for(task, 5)


@pytest.fixture
def receiver_key(tmp_path: Path) -> Path:
    path = tmp_path / "receiver.key"
    write_secret(path, WEBHOOK_SECRET)
    return path


async def test_turning_dry_run_off_sends_the_drain_it_only_reported(
    tmp_path: Path, receiver_key: Path, receiver: FakeWebhookScheduler
) -> None:
    nvml = simulated_node()
    gpu = nvml.gpus[0]
    cfg = tmp_path / "rg.toml"
    fast = (
        "[policy]\nmin_dwell_s = 0.0\nresume_after_s = 0.2\nstale_after_s = 1.0\n"
        "evaluate_interval_s = 0.05\n"
    )
    write_config(cfg, receiver_key, extra=fast + "dry_run = true\n")
    cfg.write_text(cfg.read_text().replace("http://127.0.0.1:9/none", receiver.url))
    daemon = Daemon(load_config(cfg), config_path=cfg, nvml=nvml)
    task = asyncio.create_task(daemon.run(handle_signals=False))
    try:
        await asyncio.wait_for(daemon.ready.wait(), 5)
        gpu.temperature_c = 87.0
        await wait_until(lambda: any(d.dry_run for d in daemon.engine.decisions))
        assert receiver.received == []  # dry run: reported, not sent
        write_config(cfg, receiver_key, extra=fast + "dry_run = false\n")
        cfg.write_text(cfg.read_text().replace("http://127.0.0.1:9/none", receiver.url))
        assert await daemon.reload()
        await wait_until(lambda: receiver.node_state.get("n-notify") == "drained")
    finally:
        gpu.temperature_c = 41.0
        daemon.stop()
        await asyncio.wait_for(task, 5)
