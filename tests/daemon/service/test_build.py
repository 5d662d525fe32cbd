"""The first connect: a library's stray cancellation is a failed connect, a stop is a stop."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from adapters.errors import SourceUnavailable
from daemon.app import Daemon
from daemon.config import Config, parse_config
from daemon.service.build import first_connect
from tests.daemon.service.test_reloader import BASE
from tests.daemon.service.test_runner import ScriptedAdapter
from tests.support.stray_cancel import CancelledWithResult


class ConnectRaising(ScriptedAdapter):
    """connect() raises ``error`` (a library's CancelledError, say)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__("gpus")
        self.error = error

    async def connect(self) -> None:
        await super().connect()
        raise self.error


def config(secret: Path) -> Config:
    return parse_config(BASE.format(secret=secret, gpus="", more=""))


async def test_a_stray_cancellation_at_the_first_connect_is_a_failed_connect(
    secret_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    adapter = ConnectRaising(CancelledWithResult())
    daemon = Daemon(config(secret_file), adapters={"gpus": adapter})
    cfg = daemon.config.sources["gpus"]
    # Before: the CancelledError ended a reload without a word, and the daemon's start.
    with pytest.raises(SourceUnavailable, match="no one asked for"):
        await first_connect(adapter, cfg)
    assert adapter.closes == 1
    await daemon.check_sources()  # the start goes on; the runner retries
    warned = [r for r in caplog.records if "not reachable at start" in r.getMessage()]
    assert [r.levelno for r in warned] == [logging.WARNING]
    daemon.decisions.close()


async def test_a_stop_during_the_first_connect_is_a_stop(secret_file: Path) -> None:
    adapter = ScriptedAdapter("gpus")
    connecting = asyncio.Event()

    async def hang() -> None:
        connecting.set()
        await asyncio.sleep(3600)

    adapter.connect = hang  # type: ignore[method-assign]
    task = asyncio.create_task(first_connect(adapter, config(secret_file).sources["gpus"]))
    await connecting.wait()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled() and adapter.closes == 1
