"""Drive daemon/service/steering.py by hand: a headroom, a clock and a config the test sets."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

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


def steering(node: str, sink: object, store: DecisionStore, knobs: Knobs) -> Steering:
    """Steering as the daemon builds it for ``sink``, reading ``knobs``."""
    built = build_setting(sink, knobs.config)
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
