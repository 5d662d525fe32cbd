"""The narrow, read-only window the API and the metrics get on the running service.

Readers never see the daemon itself: what they may read is listed here, so a
handler cannot reach into the wiring, the runners or the reload machinery.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from msgspec import UNSET

from daemon.cluster.status import ClusterStatus
from daemon.delivery.outbox import Pending
from daemon.http.bodies import (
    LogItem,
    OutboxHealth,
    Overrides,
    PinEntry,
    Ready,
    SchedulerState,
)
from daemon.http.charts import ChartHistory, Charts, GpuForecast
from daemon.http.decision_log import LogQuery, page
from daemon.http.events import EventHub
from policies.model import Reading

if TYPE_CHECKING:
    from daemon.config import Config
    from daemon.delivery.deliverer import Deliverer
    from daemon.delivery.notices import JobNotices
    from daemon.delivery.outbox import DecisionStore
    from daemon.delivery.overrides import OverrideStore
    from daemon.service.engine import PolicyEngine
    from daemon.service.runner import SourceRunner
    from daemon.service.state import StateStore
    from daemon.service.throttle import ThrottleClock


@dataclass(frozen=True, slots=True)
class SourceStatus:
    """One source as readers see it."""

    name: str
    health: str
    last_error: str
    attempts: int
    failures: int
    skipped_ticks: int
    reported: bool


class ServiceView:
    """Read-only accessors over the running service's parts (config and runners follow reloads)."""

    def __init__(
        self,
        *,
        config: Callable[[], Config],
        runners: Callable[[], Sequence[SourceRunner]],
        store: StateStore,
        engine: PolicyEngine,
        decisions: DecisionStore,
        deliverer: Deliverer,
        overrides: OverrideStore,
        events: EventHub,
        simulated: bool,
        cluster: Callable[[], ClusterStatus | None] = lambda: None,
        notices: JobNotices | None = None,
        throttle: ThrottleClock | None = None,
        history: ChartHistory | None = None,
    ) -> None:
        self._config = config
        self._runners = runners
        self._store = store
        self._engine = engine
        self._decisions = decisions
        self._deliverer = deliverer
        self._overrides = overrides
        self.events = events
        # True when the GPUs are a simulation injected at start (demo, tests):
        # shown in /v1/state and /readyz so nobody mistakes it for a real node.
        self.simulated = simulated
        self._cluster = cluster
        self.notices = notices  # None where the scheduler has no job notices
        self._throttle = throttle
        self._history = history if history is not None else ChartHistory()

    @property
    def config(self) -> Config:
        """The configuration in force (after the last successful reload)."""
        return self._config()

    @property
    def generation(self) -> int:
        """Changes whenever readings change."""
        return self._store.generation

    def readings(self) -> list[Reading]:
        """The latest reading of every series."""
        return list(self._store.readings())

    @property
    def outcome(self) -> Any:
        """The policy's latest evaluation (None before the first)."""
        return self._engine.last

    @property
    def evaluated_at(self) -> float | None:
        """When (Unix time) the policy last evaluated (None before the first)."""
        return self._engine.last_wall

    @property
    def rack(self) -> str:
        """The rack the policy places this node in."""
        return self._engine.rack

    @property
    def node_action(self) -> Any:
        """What rackguard last asked for this node (an Action)."""
        return self._engine.state.action

    @property
    def breaker_open(self) -> bool:
        """Whether the storm breaker holds predictive drains."""
        return bool(self._engine.policy.breaker.open)

    def rack_tracker(self) -> Any:
        """The policy's tracker of this node's rack (None before its first reading)."""
        return self._engine.policy.tracker.rack.get(self._engine.rack)

    def sources(self) -> list[SourceStatus]:
        """Every running source's health and counters."""
        return [
            SourceStatus(
                r.name,
                r.health.value,
                r.stats.last_error,
                r.stats.attempts,
                r.stats.failures,
                r.stats.skipped_ticks,
                self._store.reported(r.name),
            )
            for r in self._runners()
        ]

    def charts(self) -> Charts:
        """The page's charts: recent points, and the policy's forecast of each GPU."""
        h = self._history
        return Charts(h.window_s, h.step_s, h.series(time.time()), self.gpu_forecasts())

    def gpu_forecasts(self) -> list[GpuForecast]:
        """Each local GPU's temperature trend (°C/min) as the policy fitted it, with its band."""
        tracker = self._engine.policy.tracker
        node = tracker.nodes.get(tracker.default_node or "")
        out: list[GpuForecast] = []
        for label, g in sorted((node.gpus if node else {}).items(), key=lambda kv: _index(kv[0])):
            trend = g.margin.trend
            if trend is None:
                out.append(GpuForecast(f"gpu{label}", False, None, None, None))
                continue
            # The margin falls as the temperature rises: the temperature's slope is its negative.
            out.append(
                GpuForecast(
                    f"gpu{label}",
                    g.margin.trusted,
                    -trend.slope * 60,
                    -trend.hi * 60,
                    -trend.lo * 60,
                )
            )
        return out

    def throttled_seconds(self) -> dict[tuple[str, str, str], float]:
        """(gpu, uuid, reason) -> seconds the GPU's clocks were cut for that reason."""
        return dict(self._throttle.seconds) if self._throttle is not None else {}

    def pending(self) -> list[Pending]:
        """Decisions waiting for the scheduler, oldest first."""
        return self._decisions.pending()

    def pending_count(self) -> int:
        """How many decisions wait for the scheduler."""
        return len(self._decisions)

    @property
    def storage_error(self) -> str:
        """Why the decision store does not take writes now ("" while it does)."""
        return self._decisions.error

    def not_durable(self) -> int:
        """Decision changes held in memory only, waiting for the disk."""
        return self._decisions.not_durable()

    @property
    def write_failures(self) -> int:
        """Write transactions the disk refused, since start."""
        return self._decisions.write_failures

    def delivery_failures(self) -> dict[str, int]:
        """Failed delivery attempts by reason, since start."""
        return dict(self._deliverer.failures)

    def undeliverable(self) -> list[Pending]:
        """Decisions undelivered past ``[scheduler] undeliverable_after_s``, oldest first."""
        return self._deliverer.undeliverable()

    def scheduler_state(self) -> SchedulerState:
        """This node's newest decision, its delivery, and the scheduler's state as read back."""
        node = self.config.node.name
        latest = self._decisions.latest(node)
        seen = self._deliverer.read_back.get(node)
        return SchedulerState(
            intent=latest.decision.action if latest else None,
            delivery=latest.status if latest else None,
            attempts=latest.attempts if latest else 0,
            last_error=latest.last_error if latest else "",
            read_back=seen.state if seen else None,
            read_back_at=seen.at if seen else None,
        )

    @property
    def refusal(self) -> str:
        """The scheduler's refusal an operator must fix, or ""."""
        return self._deliverer.refusal

    def problems(self) -> list[str]:
        """Why the store or the delivery is not healthy (the store's and deliverer's checks)."""
        checks = self._decisions.health() + self._deliverer.health()
        return [reason for ok, reason in checks if not ok]

    def readiness(self) -> Ready:
        """The /readyz body: every source reported once, the store and delivery healthy."""
        statuses = self.sources()
        sources = {s.name: s.reported for s in statuses}
        degraded = {s.name: s.last_error for s in statuses if s.health == "degraded"}
        problems = self.problems()
        error = self.storage_error
        cluster = self._cluster()
        return Ready(
            ready=all(sources.values()) and not problems,
            sources=sources,
            outbox=OutboxHealth(writable=not error, error=error),
            problems=problems,
            simulated=self.simulated,
            cluster=UNSET if cluster is None else cluster,
            degraded=degraded or UNSET,
        )

    async def decision_page(self, query: LogQuery) -> tuple[list[LogItem], str | None]:
        """One page of the decision log (read on the store's thread)."""
        return await self._decisions.query(lambda db: page(db, query))

    def overrides(self) -> Overrides:
        """The operator overrides in force."""
        o = self._overrides
        return Overrides(
            pins=[PinEntry(node, pin, reason) for node, (pin, reason) in sorted(o.pins.items())],
            predictive_paused=o.paused[0],
            paused_reason=o.paused[1],
        )


def _index(label: str) -> tuple[int, str]:
    """GPU labels in numeric order ("2" before "10")."""
    return (int(label), "") if label.isdigit() else (1 << 30, label)
