"""The durable outbox: every decision is written to SQLite before it is sent.

One row per decision, in the order the policy made them. Delivery takes the
oldest pending row, and for a sink that can read nodes back it:

1. reads the node first: held by someone else or for another reason -> the row
   is SKIPPED and the node left alone; already in the intended state -> the row
   is CONFIRMED with no write (so a delivery interrupted by ``kill -9`` after
   the scheduler applied it is never applied twice);
2. writes, then reads back: only the intended state read back confirms it.

Failures retry with capped exponential backoff and jitter, head of line, so
decisions reach the scheduler in the order they were made. A newer decision for
a node supersedes its undelivered one (a drain then a resume, neither sent,
sends nothing). A restart, ``kill -9`` included, resumes from the rows left
pending. The database is in WAL mode with synchronous=FULL: a decision rarely
comes more than once a minute, and each one must survive a power cut.

The sqlite3 calls run on the event loop thread: submit() is called
synchronously by the policy engine and must have written the row when it
returns, and each statement takes well under a millisecond.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import fcntl
import logging
import os
import random
import sqlite3
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

import orjson

from adapters.base import DeliveryError, SchedulerSink
from adapters.schedulers.base import NodeReadError, NodeView, ReadableSink, describe, intended
from adapters.schedulers.decision_json import decision_to_dict
from daemon.delivery.sqlite_tx import transaction
from daemon.service.backoff import capped_backoff
from policies.model import Action, Assessment, Condition, Decision, FaultDomain

log = logging.getLogger(__name__)

MEMORY = ":memory:"
KEEP_DONE_ROWS = 10_000

# Waits ``delay`` seconds or until the event is set; injectable so tests can
# run a ten-minute outage in simulated time.
Sleep = Callable[[float, asyncio.Event], Awaitable[None]]


BUSY_TIMEOUT_MS = 5000


class Status(enum.StrEnum):
    """Where a decision stands."""

    PENDING = "pending"  # not yet confirmed by the scheduler
    CONFIRMED = "confirmed"  # the scheduler shows the intended state
    SUPERSEDED = "superseded"  # replaced by a newer decision before delivery
    SKIPPED = "skipped"  # the node is held by someone else: left alone
    FAILED = "failed"  # refused for good (unknown node, no permission, ...)


class OutboxBusy(Exception):
    """Another process holds this outbox; two deliverers would apply decisions twice."""


@dataclass(slots=True)
class Pending:
    """A decision waiting for the scheduler to confirm it."""

    decision: Decision
    attempts: int = 0
    last_error: str = ""
    seq: int = 0
    queued_at: float = 0.0  # wall clock
    origin: str = "policy"  # "policy" or "reconcile"


@dataclass(frozen=True, slots=True)
class Record:
    """One row of the outbox, any status."""

    seq: int
    decision: Decision
    status: Status
    attempts: int
    last_error: str
    outcome: str
    origin: str
    queued_at: float
    done_at: float | None


_SCHEMA = """
CREATE TABLE IF NOT EXISTS decisions (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT NOT NULL UNIQUE,
    base_key TEXT NOT NULL,
    node TEXT NOT NULL,
    action TEXT NOT NULL,
    body BLOB NOT NULL,
    origin TEXT NOT NULL,
    status TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    sent INTEGER NOT NULL DEFAULT 0,
    last_error TEXT NOT NULL DEFAULT '',
    outcome TEXT NOT NULL DEFAULT '',
    queued_at REAL NOT NULL,
    done_at REAL
);
CREATE INDEX IF NOT EXISTS decisions_node ON decisions (node, seq);
CREATE INDEX IF NOT EXISTS decisions_status ON decisions (status, seq);
CREATE INDEX IF NOT EXISTS decisions_base_key ON decisions (base_key);
"""
_COLUMNS = "seq, body, status, attempts, last_error, outcome, origin, queued_at, done_at, key"


def decision_from_dict(data: dict[str, Any]) -> Decision:
    """The inverse of decision_json.decision_to_dict."""
    evidence = tuple(
        Assessment(
            subject=a["subject"],
            domain=FaultDomain(a["domain"]),
            condition=Condition(a["condition"]),
            at=float(a.get("at", data["at"])),
            value=a["value"],
            unit=a["unit"],
            threshold=a["threshold"],
            trend_per_min=a["trend_per_min"],
            time_to_threshold_s=a["time_to_threshold_s"],
            detail=a["detail"],
        )
        for a in data.get("evidence", ())
    )
    return Decision(
        node=data["node"],
        action=Action(data["action"]),
        reason=data["reason"],
        domain=FaultDomain(data["domain"]),
        at=float(data["at"]),
        key=data["key"],
        evidence=evidence,
        dry_run=bool(data.get("dry_run", False)),
    )


def _encode(decision: Decision) -> bytes:
    data = decision_to_dict(decision)
    # decision_to_dict leaves out each assessment's own time; keep it.
    for item, a in zip(data["evidence"], decision.evidence, strict=True):
        item["at"] = a.at
    return orjson.dumps(data)


async def wait_or_wake(delay: float, wake: asyncio.Event) -> None:
    """The real Sleep: ``delay`` seconds, or less if ``wake`` is set."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(delay):
            await wake.wait()


class Outbox:
    """Durable, ordered, coalescing delivery of decisions to one scheduler sink."""

    def __init__(
        self,
        path: Path | str,
        sink: SchedulerSink | None,
        *,
        retry_initial_s: float = 1.0,
        retry_max_s: float = 60.0,
        rng: random.Random | None = None,
        sleep: Sleep = wait_or_wake,
        wall: Callable[[], float] = time.time,
        on_settled: Callable[[Decision, Status, str], None] | None = None,
    ) -> None:
        self._sink = sink
        # Called once a delivered row is confirmed, skipped or failed (metrics, events).
        self.on_settled = on_settled
        self._retry_initial_s = retry_initial_s
        self._retry_max_s = retry_max_s
        self._rng = rng or random.Random()
        self._sleep = sleep
        self._wall = wall
        self._wakeup = asyncio.Event()
        self._inflight: int | None = None  # seq of the row being delivered
        self._failures = 0  # consecutive failed attempts, for the backoff
        self.path = str(path)
        self._lock_fh: IO[bytes] | None = None
        if self.path != MEMORY:
            self._lock_fh = self._take_lock(Path(self.path))
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            self._db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            if self.path != MEMORY:
                self._db.execute("PRAGMA journal_mode = WAL")
            self._db.execute("PRAGMA synchronous = FULL")
            self._db.executescript(_SCHEMA)
            self._prune()
        except sqlite3.Error:
            self.close()
            raise
        left = self._count(Status.PENDING)
        if left:
            log.info("outbox %s: %d undelivered decision(s) carried over", self.path, left)

    # ------------------------------------------------------------------ setup

    @staticmethod
    def _take_lock(path: Path) -> IO[bytes]:
        path.parent.mkdir(parents=True, exist_ok=True)
        fh = (path.parent / (path.name + ".lock")).open("ab")
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as err:
            fh.close()
            raise OutboxBusy(f"outbox {path} is in use by another rackguard process") from err
        return fh

    def close(self) -> None:
        """Close the database and release the lock; pending rows stay for the next start."""
        self._db.close()
        if self._lock_fh is not None:
            self._lock_fh.close()
            self._lock_fh = None

    def _tx(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        return transaction(self._db)

    def _prune(self) -> None:
        with self._tx() as db:
            db.execute(
                "DELETE FROM decisions WHERE status != ? AND seq NOT IN "
                "(SELECT seq FROM decisions WHERE status != ? ORDER BY seq DESC LIMIT ?) "
                "AND seq NOT IN (SELECT MAX(seq) FROM decisions GROUP BY node)",
                (Status.PENDING, Status.PENDING, KEEP_DONE_ROWS),
            )

    # ------------------------------------------------------------------ queries

    @property
    def db(self) -> sqlite3.Connection:
        """The connection, for tables kept beside the decisions (overrides, audit)."""
        return self._db

    def writable(self) -> tuple[bool, str]:
        """Whether a write transaction can start now (for readiness checks).

        Never waits: with another process holding the lock, the usual busy
        timeout would stall the event loop (and the watchdog) for seconds.
        """
        try:
            self._db.execute("PRAGMA busy_timeout = 0")
            try:
                self._db.execute("BEGIN IMMEDIATE")
                self._db.execute("ROLLBACK")
            finally:
                self._db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        except sqlite3.Error as err:
            return False, str(err)
        return True, ""

    def _count(self, status: Status) -> int:
        (n,) = self._db.execute(
            "SELECT COUNT(*) FROM decisions WHERE status = ?", (status,)
        ).fetchone()
        return int(n)

    def submitted_count(self) -> int:
        """How many decisions were ever submitted (and kept), reconciler repairs excluded."""
        (n,) = self._db.execute("SELECT COUNT(*) FROM decisions WHERE origin = 'policy'").fetchone()
        return int(n)

    @staticmethod
    def _record(row: tuple[Any, ...]) -> Record:
        seq, body, status, attempts, last_error, outcome, origin, queued_at, done_at, key = row
        decision = replace(decision_from_dict(orjson.loads(body)), key=key)
        return Record(
            seq, decision, Status(status), attempts, last_error, outcome, origin, queued_at, done_at
        )

    def pending(self) -> list[Pending]:
        """Decisions not yet confirmed, oldest first (the backlog)."""
        rows = self._db.execute(
            f"SELECT {_COLUMNS} FROM decisions WHERE status = ? ORDER BY seq", (Status.PENDING,)
        ).fetchall()
        out = []
        for row in rows:
            r = self._record(row)
            out.append(Pending(r.decision, r.attempts, r.last_error, r.seq, r.queued_at, r.origin))
        return out

    def history(self, limit: int = 100) -> list[Record]:
        """The newest ``limit`` rows, newest first."""
        rows = self._db.execute(
            f"SELECT {_COLUMNS} FROM decisions ORDER BY seq DESC LIMIT ?", (limit,)
        ).fetchall()
        return [self._record(row) for row in rows]

    def intents(self) -> dict[str, Decision]:
        """Per node, the newest decision: the state rackguard intends the node to be in."""
        rows = self._db.execute(
            f"SELECT {_COLUMNS} FROM decisions WHERE seq IN "
            "(SELECT MAX(seq) FROM decisions GROUP BY node) ORDER BY seq"
        ).fetchall()
        return {r.decision.node: r.decision for r in map(self._record, rows)}

    @property
    def confirmed(self) -> dict[str, Action]:
        """Per node, the newest action the scheduler confirmed."""
        rows = self._db.execute(
            "SELECT node, action FROM decisions WHERE seq IN "
            "(SELECT MAX(seq) FROM decisions WHERE status = ? GROUP BY node)",
            (Status.CONFIRMED,),
        ).fetchall()
        return {node: Action(action) for node, action in rows}

    @property
    def failed(self) -> list[tuple[Decision, str]]:
        """Decisions refused for good, oldest first, with the error."""
        rows = self._db.execute(
            f"SELECT {_COLUMNS} FROM decisions WHERE status = ? ORDER BY seq", (Status.FAILED,)
        ).fetchall()
        return [(r.decision, r.last_error) for r in map(self._record, rows)]

    def busy_nodes(self) -> set[str]:
        """Nodes with a decision pending or being delivered: the reconciler leaves them be."""
        rows = self._db.execute(
            "SELECT DISTINCT node FROM decisions WHERE status = ?", (Status.PENDING,)
        ).fetchall()
        return {node for (node,) in rows}

    # ------------------------------------------------------------------ writes

    def submit(self, decision: Decision) -> str | None:
        """Write a decision durably and queue it; returns the key it is stored under.

        A newer decision for the same node supersedes an undelivered one. A key
        already used (the policy's epochs restart with the process) gets a suffix,
        so every stored decision has its own idempotency key. Dry-run decisions
        are not stored: None.
        """
        if decision.dry_run:
            return None
        return self._insert(decision, origin="policy")

    def enqueue_repair(self, intent: Decision, note: str) -> str | None:
        """Queue the intent again because the scheduler drifted from it (reconciliation).

        Does nothing (None) when a newer decision or a pending one exists for the node.
        """
        latest = self._db.execute(
            "SELECT key, status FROM decisions WHERE node = ? ORDER BY seq DESC LIMIT 1",
            (intent.node,),
        ).fetchone()
        if latest is None or latest[0] != intent.key or latest[1] == Status.PENDING:
            return None
        log.warning("%s: %s; re-applying %s", intent.node, note, intent.action)
        return self._insert(intent, origin="reconcile")

    def _insert(self, decision: Decision, *, origin: str) -> str | None:
        node = decision.node
        now = self._wall()
        with self._tx() as db:
            # Keys repeat (a policy restarted, a repair re-queuing an intent):
            # store under the original key's first free "-N" suffix.
            base = decision.key
            row = db.execute("SELECT base_key FROM decisions WHERE key = ?", (base,)).fetchone()
            if row is not None:
                base = row[0]
            key, n = base, 0
            while db.execute("SELECT 1 FROM decisions WHERE key = ?", (key,)).fetchone():
                n += 1
                key = f"{base}-{n}"
            waiting = db.execute(
                "SELECT seq, action, sent FROM decisions WHERE node = ? AND status = ?"
                " ORDER BY seq",
                (node, Status.PENDING),
            ).fetchall()
            replaceable = [(seq, a, n) for seq, a, n in waiting if seq != self._inflight]
            for seq, old_action, _ in replaceable:
                db.execute(
                    "UPDATE decisions SET status = ?, outcome = ?, done_at = ? WHERE seq = ?",
                    (Status.SUPERSEDED, f"superseded by {decision.action}", now, seq),
                )
                log.info("%s: %s supersedes undelivered %s", node, decision.action, old_action)
            status = Status.PENDING
            outcome = ""
            # A row whose write was started may have reached the scheduler before a
            # crash or a timeout: then the new decision is needed whatever was confirmed.
            maybe_sent = len(replaceable) < len(waiting) or any(n for _, _, n in replaceable)
            if replaceable and not maybe_sent:
                # e.g. a drain then a resume, neither delivered: the scheduler
                # never saw the drain, so the resume is not needed either.
                last = self._confirmed_action(db, node)
                if decision.action is last:
                    status, outcome = Status.SUPERSEDED, "nothing left to send"
                    log.info("%s: %s: nothing left to send", node, decision.action)
            db.execute(
                "INSERT INTO decisions (key, base_key, node, action, body, origin, status,"
                " outcome, queued_at, done_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    key,
                    base,
                    node,
                    decision.action.value,
                    _encode(decision),
                    origin,
                    status,
                    outcome,
                    now,
                    now if status is not Status.PENDING else None,
                ),
            )
        if status is Status.PENDING:
            self._wakeup.set()
        return key

    @staticmethod
    def _confirmed_action(db: sqlite3.Connection, node: str) -> Action:
        row = db.execute(
            "SELECT action FROM decisions WHERE node = ? AND status = ? ORDER BY seq DESC LIMIT 1",
            (node, Status.CONFIRMED),
        ).fetchone()
        return Action(row[0]) if row else Action.RESUME  # never touched: in service

    def _finish(self, seq: int, status: Status, outcome: str, error: str = "") -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE decisions SET status = ?, outcome = ?, last_error = ?, done_at = ?"
                " WHERE seq = ? AND status = ?",
                (status, outcome, error, self._wall(), seq, Status.PENDING),
            )

    # ------------------------------------------------------------------ delivery

    def _next(self) -> tuple[int, Decision, int] | None:
        row = self._db.execute(
            "SELECT seq, body, key, attempts FROM decisions WHERE status = ? ORDER BY seq LIMIT 1",
            (Status.PENDING,),
        ).fetchone()
        if row is None:
            return None
        seq, body, key, attempts = row
        return seq, replace(decision_from_dict(orjson.loads(body)), key=key), attempts

    def _retry_delay(self) -> float:
        base = capped_backoff(self._retry_initial_s, self._retry_max_s, self._failures)
        return base * self._rng.uniform(0.5, 1.0)

    async def run(self) -> None:
        """Deliver until cancelled."""
        while True:
            nxt = self._next()
            if nxt is None:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            seq, decision, attempts = nxt
            if self._sink is None:
                log.warning(
                    "%s: no scheduler configured; %s not delivered", decision.node, decision.action
                )
                self._finish(seq, Status.FAILED, "no scheduler configured", "no scheduler")
                continue
            self._inflight = seq
            attempts += 1
            self._db.execute("UPDATE decisions SET attempts = ? WHERE seq = ?", (attempts, seq))
            try:
                status, outcome = await self._attempt(self._sink, decision)
            except DeliveryError as err:
                self._inflight = None
                self._db.execute(
                    "UPDATE decisions SET last_error = ? WHERE seq = ?", (str(err), seq)
                )
                if err.permanent:
                    log.error(
                        "%s: %s refused by %s, not retried: %s",
                        decision.node,
                        decision.action,
                        self._sink.name,
                        err,
                    )
                    self._finish(seq, Status.FAILED, "refused", str(err))
                    self._settled(decision, Status.FAILED, str(err))
                    continue
                await self._back_off(decision, attempts, err)
                continue
            self._inflight = None
            self._finish(seq, status, outcome)
            self._settled(decision, status, outcome)
            if self._failures:
                log.info("%s: reachable again", self._sink.name)
            self._failures = 0
            level = logging.WARNING if status is Status.SKIPPED else logging.INFO
            log.log(
                level,
                "%s: %s %s by %s after %d attempt(s): %s",
                decision.node,
                decision.action,
                status,
                self._sink.name,
                attempts,
                outcome,
            )

    def _settled(self, decision: Decision, status: Status, outcome: str) -> None:
        if self.on_settled is not None:
            self.on_settled(decision, status, outcome)

    async def _back_off(self, decision: Decision, attempts: int, err: DeliveryError) -> None:
        assert self._sink is not None
        self._failures += 1
        delay = self._retry_delay()
        level = logging.WARNING if self._failures == 1 else logging.DEBUG
        log.log(
            level,
            "%s: delivering %s to %s failed (attempt %d), retry in %.1fs: %s",
            decision.node,
            decision.action,
            self._sink.name,
            attempts,
            delay,
            err,
        )
        # Sleep, but wake early if a newer decision arrives (it may replace this one).
        self._wakeup.clear()
        await self._sleep(delay, self._wakeup)

    def _mark_sent(self) -> None:
        """Note, before writing, that the scheduler may see this row from now on."""
        self._db.execute("UPDATE decisions SET sent = 1 WHERE seq = ?", (self._inflight,))

    async def _attempt(self, sink: SchedulerSink, decision: Decision) -> tuple[Status, str]:
        if not isinstance(sink, ReadableSink):
            self._mark_sent()
            await sink.deliver(decision)
            return Status.CONFIRMED, "accepted"
        node = decision.node
        before = await _read_one(sink, node)
        if before.foreign:
            return Status.SKIPPED, f"left alone: {describe(before)}"
        if before.satisfies(decision.action):
            return Status.CONFIRMED, f"already {describe(before)}"
        self._mark_sent()
        await sink.deliver(decision)
        after = await _read_one(sink, node)
        if after.satisfies(decision.action):
            return Status.CONFIRMED, f"read back {describe(after)}"
        if after.foreign:
            return Status.SKIPPED, f"taken over meanwhile: {describe(after)}"
        raise DeliveryError(
            f"{node}: written, but the scheduler shows {describe(after)}, not {intended(decision)}"
        )


async def _read_one(sink: ReadableSink, node: str) -> NodeView:
    try:
        views = await sink.read_state([node])
    except NodeReadError as err:
        raise DeliveryError(f"reading {node}: {err}", permanent=err.permanent) from err
    view = views.get(node)
    if view is None or not view.exists:
        raise DeliveryError(f"{node}: the scheduler does not know this node", permanent=True)
    return view


def default_path() -> Path:
    """Where the outbox lives when the config does not say: systemd's StateDirectory."""
    state = os.environ.get("STATE_DIRECTORY", "/var/lib/rackguard").split(":")[0]
    return Path(state) / "outbox.sqlite3"
