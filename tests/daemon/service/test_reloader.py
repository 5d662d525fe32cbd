"""Reload is atomic: a config that cannot be applied in full changes nothing, and says why."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from daemon.app import Daemon
from daemon.config import load_config
from fakes.nvml import FakeNvml
from fakes.nvml_module import simulated_node
from tests.support.wait import wait_until

BASE = """
[node]
name = "n-reload"
[api]
port = 0
[sources.gpus]
type = "nvml"
interval_s = 0.1
timeout_s = 0.05
{gpus}
{more}
[scheduler]
type = "webhook"
url = "http://127.0.0.1:9/none"
secret_file = "{secret}"
"""


def write(path: Path, secret: Path, *, gpus: str = "", more: str = "") -> None:
    path.write_text(BASE.format(secret=secret, gpus=gpus, more=more))


@pytest.fixture
async def running(
    tmp_path: Path, secret_file: Path
) -> AsyncIterator[tuple[Daemon, Path, FakeNvml]]:
    cfg = tmp_path / "rg.toml"
    write(cfg, secret_file)
    nvml = simulated_node()
    daemon = Daemon(load_config(cfg), config_path=cfg, nvml=nvml)
    task = asyncio.create_task(daemon.run(handle_signals=False))
    try:
        await asyncio.wait_for(daemon.ready.wait(), 5)
        yield daemon, cfg, nvml
    finally:
        daemon.stop()
        await asyncio.wait_for(task, 5)


def refusals(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "refused, keeping the running config" in r.getMessage()]


async def test_a_new_source_that_cannot_connect_refuses_the_whole_reload(
    running: tuple[Daemon, Path, FakeNvml], secret_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    daemon, cfg, _ = running
    (old,) = daemon.runners
    # A second NVML source asking for a GPU this node does not have, and a
    # policy change in the same file: neither may take effect.
    write(
        cfg,
        secret_file,
        more='[sources.more]\ntype = "nvml"\ninterval_s = 0.1\ntimeout_s = 0.05\ngpus = [99]\n'
        "[policy]\nenter_margin_c = 7.0\n",
    )
    assert not await daemon.reload()
    (record,) = refusals(caplog)
    assert record.levelno == logging.ERROR
    assert "sources.more: cannot connect" in record.getMessage()
    assert "[99] do not exist" in record.getMessage()
    assert daemon.runners == [old] and daemon.engine.settings.enter_margin_c != 7.0
    assert "more" not in daemon.config.sources
    assert not any("reloaded" in r.getMessage() for r in caplog.records)
    polls = old.stats.attempts
    await wait_until(lambda: old.stats.attempts > polls + 2, what="the old runner keeps polling")
    assert daemon.view.readiness().ready


async def test_a_changed_source_that_cannot_start_keeps_the_old_one_polling(
    running: tuple[Daemon, Path, FakeNvml], secret_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    daemon, cfg, _ = running
    (old,) = daemon.runners
    write(cfg, secret_file, gpus="gpus = [0, 42]")
    assert not await daemon.reload()
    assert "sources.gpus: cannot connect" in refusals(caplog)[0].getMessage()
    assert daemon.runners == [old] and old.health.value == "up"
    assert b'rackguard_source_up{source="gpus"} 1.0' in daemon.metrics.render()
    # Fixed: the next reload applies.
    write(cfg, secret_file, gpus="gpus = [0, 1]")
    assert await daemon.reload()
    (new,) = daemon.runners
    assert new is not old and new.adapter is not old.adapter
    await wait_until(lambda: new.health.value == "up", what="the new runner up")


async def test_a_source_whose_device_is_down_refuses_the_reload(
    running: tuple[Daemon, Path, FakeNvml], secret_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    daemon, cfg, nvml = running
    (old,) = daemon.runners
    nvml.init_error = 9  # NVML_ERROR_DRIVER_NOT_LOADED: a new session cannot start
    write(cfg, secret_file, gpus="gpus = [0]")
    try:
        assert not await daemon.reload()
    finally:
        nvml.init_error = None
    assert "sources.gpus" in refusals(caplog)[0].getMessage()
    assert daemon.runners == [old]


@pytest.mark.parametrize(
    "content",
    [
        b"# Temp\xe9rature\n",  # Latin-1: not UTF-8
        b"[node\n",  # not TOML
        b"\x00\xff\xfe",
    ],
)
async def test_an_unreadable_file_keeps_the_running_config_in_one_record(
    running: tuple[Daemon, Path, FakeNvml], content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    daemon, cfg, _ = running
    before = daemon.config
    cfg.write_bytes(content + cfg.read_bytes())
    assert not await daemon.reload()
    (record,) = refusals(caplog)
    assert str(cfg) in record.getMessage()
    assert daemon.config is before


async def test_a_missing_file_keeps_the_running_config(
    running: tuple[Daemon, Path, FakeNvml], caplog: pytest.LogCaptureFixture
) -> None:
    daemon, cfg, _ = running
    cfg.unlink()
    assert not await daemon.reload()
    assert "cannot read config" in refusals(caplog)[0].getMessage()
