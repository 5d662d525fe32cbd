"""Drive daemon/service/steering.py by hand: a headroom, a clock and a config the test sets.

A pytest plugin (tests/conftest.py loads it): ``knobs``, and ``steer``, the
steering of the test module's ``NODE`` through the module's ``backend`` fixture,
on an outbox of the test's own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from adapters.schedulers.backend import Backend
from daemon.config.steering import SteeringConfig
from daemon.delivery.outbox import DecisionStore
from daemon.service.steering import Steering, build_setting
from policies.headroom import NodeHeadroom


@dataclass
class Knobs:
    """What steering reads from the rest of the daemon, set by the test."""

    config: SteeringConfig = field(
        default_factory=lambda: SteeringConfig(enabled=True, min_interval_s=300.0)
    )
    headroom: NodeHeadroom | None = None
    held: bool = False
    busy: bool = False
    now: float = 1_000_000.0

    def margin(self, margin_c: float, *, trusted: bool = True) -> None:
        """The policy's headroom at full load, for a node of 4 GPUs."""
        self.headroom = NodeHeadroom(margin_c, trusted, 4 if trusted else 3, 4)

    def later(self, seconds: float) -> None:
        self.now += seconds

    def set(self, **changes: object) -> None:
        self.config = dataclasses.replace(self.config, **changes)  # type: ignore[arg-type]


def steering(node: str, backend: Backend, store: DecisionStore, knobs: Knobs) -> Steering:
    """Steering as the daemon builds it for ``backend``, reading ``knobs``."""
    built = build_setting(backend, knobs.config)
    assert built is not None
    setting, value_of = built
    return Steering(
        node,
        setting,
        store,
        config=lambda: knobs.config,
        value_of=value_of,
        headroom=lambda: knobs.headroom,
        held=lambda: knobs.held,
        busy=lambda: knobs.busy,
        wall=lambda: knobs.now,
    )


@pytest.fixture
def knobs() -> Knobs:
    """Steering enabled with the default buckets, no headroom yet."""
    return Knobs()


@pytest.fixture
def steer(request: pytest.FixtureRequest, tmp_path: Path, knobs: Knobs) -> Iterator[Steering]:
    """Steering of the module's ``NODE`` through its ``backend`` fixture."""
    backend = request.getfixturevalue("backend")
    store = DecisionStore(tmp_path / "outbox.sqlite3")
    try:
        yield steering(request.module.NODE, backend, store, knobs)
    finally:
        store.close()
