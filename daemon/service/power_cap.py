"""The policy's cap decisions applied through the PowerLimiter, durable in the decision store.

Each evaluation hands its cap decisions here (:meth:`PowerCaps.take`); they are
applied in order. A cap's row is written *before* the limit is set, so a crash
between the two leaves a row whose limit either is enforced (rackguard's, carried
on) or is not (released on the next evaluation as not rackguard's: nothing is
capped twice and nothing is restored above what was found). A restore's row is
updated, or deleted on the last step, after the limit is set.

The limits are read on every pass (``interval_s``): the ladder learns NVML's
constraints and the policy sees, through the NVML source's power-limit reading,
when someone else changed a limit. ``dry_run`` is the limiter's (DryRunLimiter).
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any, Final

import orjson

from adapters.sensors.power_limit import GpuLimit, PowerLimitError
from daemon.config import Config
from daemon.delivery.outbox import DecisionStore, StorageError
from daemon.service.engine import PolicyEngine
from daemon.service.power_limit import WatchedLimiter, build_limiter
from policies.power_cap import CapAction, CapDecision, CapLadder, CapSettings, CapState

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class GpuCap:
    """One GPU's power limit as last read, and whose cap it is."""

    gpu: int
    enforced_w: float
    cap_w: float | None  # the limit while below the GPU's default; null when not capped
    set_by: str  # "rackguard", "other" (an administrator, another tool) or ""
    before_w: float | None  # rackguard's cap: the limit it restores to, never above
    cause: str  # rackguard's cap: "margin", "loop" or "inlet"
    escalated: bool  # rackguard's cap did not hold the margin: the node's drain went ahead


@dataclass(frozen=True, slots=True)
class CapRecord:
    """One cap decision as the API shows it (``at`` in Unix time)."""

    at: float
    gpu: str
    action: str  # cap, restore or release
    watts: float  # the limit set (release: the limit found, left as it is)
    reason: str
    dry_run: bool
    node: str = ""
    before_w: float = 0.0  # the limit before rackguard capped: never restored above it
    set_by: str = "rackguard"  # release: "other", the actor whose limit was found
    error: str = ""  # the set was refused (NVML, the helper): nothing applied


KEEP_CAP_LOG_ROWS: Final = 10_000


_UPSERT: Final = (
    "INSERT INTO power_caps (node, gpu, limit_w, before_w, cause, escalated, capped_at)"
    " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (node, gpu) DO UPDATE SET"
    " limit_w = excluded.limit_w, before_w = excluded.before_w, cause = excluded.cause,"
    " escalated = excluded.escalated"
)


class PowerCaps:
    """Applies one node's cap decisions and keeps what the API and metrics show of them."""

    def __init__(
        self,
        node: str,
        limiter: WatchedLimiter,
        store: DecisionStore,
        ladder: CapLadder,
        *,
        history: int = 200,
        wall: Callable[[], float] = time.time,
        mono: Callable[[], float] = time.monotonic,
    ) -> None:
        self.node = node
        self.limiter = limiter
        self._store = store
        self.ladder = ladder
        self._wall = wall
        self._mono = mono
        self._queue: asyncio.Queue[CapDecision] = asyncio.Queue()
        self.decisions: deque[CapDecision] = deque(maxlen=history)
        self.capped_seconds: dict[str, float] = {}  # GPU index -> seconds under rackguard's cap
        self.failures = 0
        self._last_pass: float | None = None
        self.on_record: Callable[[CapRecord], None] | None = None  # e.g. the SSE hub

    async def load(self) -> int:
        """Adopt the caps the store holds for this node (after a restart); returns how many."""

        def read(db: sqlite3.Connection) -> list[tuple[Any, ...]]:
            sql = "SELECT gpu, limit_w, before_w, cause, escalated FROM power_caps WHERE node = ?"
            return db.execute(sql, (self.node,)).fetchall()

        rows = await self._store.query(read)
        now = self._mono()
        for gpu, limit_w, before_w, cause, escalated in rows:
            state = CapState(
                self.node, str(gpu), float(limit_w), float(before_w), now, str(cause),
                escalated=bool(escalated), last_step=now,
            )  # fmt: skip
            self.ladder.restore(state)
            log.info(
                "%s: gpu%s capped to %.0fW by rackguard before the restart (%.0fW before): "
                "carried on",
                self.node, gpu, limit_w, before_w,
            )  # fmt: skip
        return len(rows)

    def take(self, decisions: list[CapDecision]) -> None:
        """The cap decisions of one evaluation, to apply in order."""
        for d in decisions:
            self.decisions.append(d)
            self._queue.put_nowait(d)
            if self.on_record is not None:
                self.on_record(_record(d))

    async def refresh(self) -> list[GpuLimit]:
        """Read the limits: the ladder learns each GPU's constraints."""
        found = await self.limiter.limits()
        for g in found:
            self.ladder.observe_limit(self.node, str(g.index), g.min_w, g.highest_settable_w)
        return found

    async def apply_pending(self) -> None:
        """Apply every decision taken so far."""
        while not self._queue.empty():
            await self.apply(self._queue.get_nowait())

    async def apply(self, d: CapDecision) -> None:
        """Set (or, for RELEASE, only forget) one GPU's limit and keep the rows in step."""
        if d.action is CapAction.RELEASE:
            log.warning("%s: %s", self.node, d.reason)
            await self._delete(d.gpu)
            await self._log(_record(d))
            return
        state = self.ladder.states.get((d.node, d.gpu))
        if d.action is CapAction.CAP and state is not None:
            await self._save(state)
        uuid = self._uuid(d.gpu)
        try:
            if uuid is None:
                raise PowerLimitError(
                    f"gpu{d.gpu}: not among the GPUs the limiter reads", permanent=True
                )
            await self.limiter.set_limit(uuid, d.watts)
        except PowerLimitError as err:
            self.failures += 1
            # Not capped: the ladder forgets the cap, so the node's drain goes ahead, and
            # asks again only after a backoff.
            wait = self.ladder.refused(d.node, d.gpu, self._mono(), permanent=err.permanent)
            await self._delete(d.gpu)
            log.error(
                "%s: gpu%s: power limit %.0fW not set: %s (asked again in %.0fs at the earliest)",
                self.node, d.gpu, d.watts, err, wait,
            )  # fmt: skip
            await self._log(replace(_record(d), error=str(err)))
            return
        self.ladder.applied(d.node, d.gpu)
        verb = "would set" if d.dry_run else "set"
        log.info("%s: %s gpu%s power limit %.0fW: %s", self.node, verb, d.gpu, d.watts, d.reason)
        if d.action is CapAction.RESTORE:
            if state is None:
                await self._delete(d.gpu)
            else:
                await self._save(state)
        await self._log(_record(d))

    async def run(self, interval_s: float) -> None:
        """Read limits and apply decisions every ``interval_s`` until cancelled."""
        while True:
            await self.step()
            await asyncio.sleep(interval_s)

    async def step(self) -> None:
        """One pass: read the limits, apply what is pending, count capped seconds."""
        try:
            await self.refresh()
        except PowerLimitError as err:
            log.warning("%s: power limits not read: %s", self.node, err)
        try:
            await self.apply_pending()
        except StorageError as err:
            log.error("%s: power cap not stored: %s", self.node, err)
        now = self._mono()
        if self._last_pass is not None:
            for node, gpu in self.ladder.states:
                if node == self.node:
                    self.capped_seconds[gpu] = self.capped_seconds.get(gpu, 0.0) + (
                        now - self._last_pass
                    )
        self._last_pass = now

    def status(self) -> list[GpuCap]:
        """Per GPU read: its limits and who set a cap (``rackguard``, ``other`` or none)."""
        out = []
        for g in self.limiter.latest():
            state = self.ladder.states.get((self.node, str(g.index)))
            ours = state is not None and abs(state.limit_w - g.requested_w) <= 1.0
            set_by = "rackguard" if ours else ("other" if g.requested_w < g.default_w else "")
            out.append(
                GpuCap(
                    g.index,
                    g.enforced_w,
                    g.requested_w if set_by else None,
                    set_by,
                    state.before_w if state is not None else None,
                    state.cause if state is not None else "",
                    state.escalated if state is not None else False,
                )
            )
        return out

    def records(self) -> list[CapRecord]:
        """The latest cap decisions, oldest first."""
        return [_record(d) for d in self.decisions]

    def _uuid(self, gpu: str) -> str | None:
        for g in self.limiter.latest():
            if str(g.index) == gpu:
                return g.uuid
        return None

    async def _save(self, st: CapState) -> None:
        params = (
            st.node, st.gpu, st.limit_w, st.before_w, st.cause, int(st.escalated), self._wall(),
        )  # fmt: skip
        await self._store.write(lambda db: db.execute(_UPSERT, params))

    async def _log(self, r: CapRecord) -> None:
        """A row of the cap log (shown in GET /v1/decisions), the oldest beyond the kept."""
        row = (r.at, r.node or self.node, r.action, orjson.dumps(r))

        def write(db: sqlite3.Connection) -> None:
            db.execute("INSERT INTO cap_log (at, node, action, body) VALUES (?, ?, ?, ?)", row)
            db.execute(
                "DELETE FROM cap_log WHERE id <= (SELECT MAX(id) FROM cap_log) - ?",
                (KEEP_CAP_LOG_ROWS,),
            )

        await self._store.write(write)

    async def _delete(self, gpu: str) -> None:
        sql = "DELETE FROM power_caps WHERE node = ? AND gpu = ?"
        await self._store.write(lambda db: db.execute(sql, (self.node, gpu)))


def _record(d: CapDecision) -> CapRecord:
    set_by = "other" if d.action is CapAction.RELEASE else "rackguard"
    return CapRecord(
        d.at, d.gpu, d.action.value, d.watts, d.reason, d.dry_run, d.node, d.before_w, set_by
    )


def build_power_caps(
    config: Config, engine: PolicyEngine, store: DecisionStore, *, nvml: Any = None
) -> PowerCaps | None:
    """None while [power_cap] is off; else the ladder in the engine's policy and its applier."""
    limiter = build_limiter(config, nvml=nvml)
    if limiter is None:
        return None
    c = config.power_cap
    # The ladder's numbers are the [power_cap] keys of the same names: read, not restated.
    numbers = {f.name: getattr(c, f.name) for f in fields(CapSettings)}
    ladder = CapLadder(CapSettings(**numbers))
    ladder.dry_run = c.effective_dry_run(config.policy.dry_run)
    engine.policy.caps = ladder
    caps = PowerCaps(engine.node, limiter, store, ladder)
    engine.on_caps = caps.take
    return caps
