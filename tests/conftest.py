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


# The real services a test session starts once (Slurm 22.05, Slurm 24.11, the systemd
# container): under pytest-xdist (`make test` runs it) all their tests run on one worker,
# so each starts once.
_SHARED_SERVICES = {"cluster": "slurm-22.05", "slurm24_cluster": "slurm-24.11"}
_WIDE_SCOPES = {"module", "package", "session"}
# Minutes of work each on one worker (the rest is spread test by test).
_FIRST = {"e2e-real-time": 0, "systemd-and-wheel": 1, "slurm-22.05": 2, "slurm-24.11": 3}
# Files whose tests share a simulation run through a per-process cache: split over
# workers, each would simulate the same scenarios again.
_CACHED_RUNS = ("tests/policies/test_scenarios.py", "tests/fakes/test_simulator.py")
_FIRST.update({path: 4 for path in _CACHED_RUNS})


# tryfirst: xdist's worker reads the marks in its own hook of this name, registered after
# this conftest and so called before it; marks added after that are never seen.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Group tests for ``--dist loadgroup``: one worker per shared service, one per file
    whose tests share a module-wide fixture (a server started once for the file)."""
    groups: dict[str, str | None] = {}
    for item in items:
        group = groups[item.nodeid] = _xdist_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    # The long serial groups first: xdist hands work out in collection order, and a long
    # group handed out last runs alone at the end while the other workers idle.
    items.sort(key=lambda item: _FIRST.get(groups[item.nodeid] or "", len(_FIRST)))


def _xdist_group(item: pytest.Item) -> str | None:
    path = item.path.relative_to(item.config.rootpath).as_posix()
    if path.startswith(("tests/systemd/", "tests/packaging/")):
        # Both build the wheel from the source tree (setuptools' build/ in it): one at a time.
        return "systemd-and-wheel"
    if path.startswith("tests/e2e/"):
        # Whole clusters in real time at a simulated speed: one at a time, so two never
        # share the cores a speed was chosen for.
        return "e2e-real-time"
    if path in _CACHED_RUNS:
        return path
    names = getattr(item, "fixturenames", ())
    for fixture, group in _SHARED_SERVICES.items():
        if fixture in names:
            return group
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs if info is not None else {}
    for name, fixturedefs in defs.items():
        # Only the project's own fixtures: pytest's and plugins' session fixtures
        # (tmp_path_factory, the asyncio loop policy) are cheap and everywhere.
        own = [d for d in fixturedefs if d.baseid.startswith("tests")]
        if name in names and own and own[-1].scope in _WIDE_SCOPES:
            return path
    return None
