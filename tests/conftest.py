"""Shared fixtures: every async test must leave no task behind."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from fakes.scheduler import FakeWebhookScheduler
from tests.support.secrets import WEBHOOK_SECRET, write_secret

# Fixtures shared by folders that have no conftest in common.
pytest_plugins = ["tests.support.steering"]


@pytest.fixture(autouse=True)
async def no_leftover_tasks() -> AsyncIterator[None]:
    """Fail a test that leaves tasks running on its event loop."""
    before = asyncio.all_tasks()
    yield
    current = asyncio.current_task()
    # Give cancelled tasks one turn to finish unwinding.
    await asyncio.sleep(0)
    left = [t for t in asyncio.all_tasks() - before if t is not current and not t.done()]
    for t in left:
        t.cancel()
    assert not left, f"test left tasks running: {[t.get_name() for t in left]}"


@pytest.fixture(autouse=True)
def state_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The outbox's default home ($STATE_DIRECTORY, as under systemd) inside the test's tmp_path.

    Inherited by the daemon processes tests start, so no test writes /var/lib/rackguard.
    """
    path = tmp_path / "state"
    monkeypatch.setenv("STATE_DIRECTORY", str(path))
    return path


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    """A readable webhook secret."""
    path = tmp_path / "webhook.key"
    write_secret(path, "s3cret-key\n")
    return path


@pytest.fixture
async def receiver() -> AsyncIterator[FakeWebhookScheduler]:
    """A fake scheduler receiving rackguard's webhook on a loopback port."""
    fake = FakeWebhookScheduler(WEBHOOK_SECRET)
    await fake.start()
    yield fake
    await fake.stop()
