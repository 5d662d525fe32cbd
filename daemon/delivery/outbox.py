"""The decision store: the outbox's rows, their state machine, and the writer thread.

The file itself (lock, open, migrate) is daemon/delivery/database.py, its tables
daemon/delivery/schema.py. One row per decision, in the order the policy made
them, beside the operator's overrides and their audit trail
(daemon/delivery/overrides.py) — one SQLite file the store alone opens and writes.

The rows the daemon works with (the backlog, each node's newest decision, each
node's newest confirmed action) are kept in memory; the database is their
durable copy. Every change is written on one dedicated thread, so a slow or
frozen disk delays decisions but never the event loop (polling, the API, the
watchdog). ``submit()`` returns a future that resolves once the row is durable
— or, when the disk refuses (full, read-only, I/O error), once it is held in
memory, marked not durable. The deliverer (daemon/delivery/deliverer.py) sends a row
only after that, so a decision is delivered whatever the disk does; rows not
yet durable are written as soon as the disk takes writes again.

The database is in WAL mode with synchronous=FULL: a decision rarely comes more
than once a minute, and each one must survive a power cut.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import logging
import secrets
import sqlite3
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any, TypeVar

import orjson

from daemon.config.outbox_path import MEMORY
from daemon.delivery.database import open_database, probe, take_lock
from daemon.delivery.sqlite_tx import transaction
from policies.codec import from_data, to_data
from policies.model import Action, Decision

log = logging.getLogger(__name__)

T = TypeVar("T")

KEEP_DONE_ROWS = 10_000
KEEP_FAILED_IN_MEMORY = 100
STALL_S = 5.0  # a write outstanding this long makes the store unhealthy
READ_TIMEOUT_S = 3.0  # an API read waiting longer (behind a stalled write) gives up
RETRY_S = 5.0  # how often rows held in memory are offered to a failing disk again


class Status(enum.StrEnum):
    """Where a decision stands."""

    PENDING = "pending"  # not yet confirmed by the scheduler
    CONFIRMED = "confirmed"  # the scheduler shows the intended state
    SUPERSEDED = "superseded"  # replaced by a newer decision before delivery
    SKIPPED = "skipped"  # the node is held by someone else: left alone
    FAILED = "failed"  # refused for good (a malformed request, no scheduler)


class StorageError(Exception):
    """The database could not do what was asked (disk full, read-only, I/O error)."""


@dataclass(slots=True)
class Pending:
    """A decision waiting for the scheduler to confirm it."""

    decision: Decision
    attempts: int = 0
    last_error: str = ""
    seq: int = 0
    queued_at: float = 0.0  # wall clock
    origin: str = "policy"  # "policy" or "reconcile"
    durable: bool = True  # False while the disk refuses and it is held in memory only


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


@dataclass(slots=True)
class Row:
    """The in-memory row; ``version`` counts changes, ``stored`` the one on disk."""

    seq: int
    decision: Decision  # carries the stored key
    base_key: str
    origin: str
    status: Status
    queued_at: float
    boot: str
    attempts: int = 0
    sent: bool = False  # a write was started: the scheduler may have seen it
    last_error: str = ""
    outcome: str = ""
    done_at: float | None = None
    version: int = 1
    stored: int = 0
    held: bool = False  # its first write was tried (durable, or held in memory)
    body: bytes = b""  # the decision as stored (encoded once)

    @property
    def durable(self) -> bool:
        """The database holds this row as it is now."""
        return self.stored == self.version

    def params(self) -> tuple[Any, ...]:
        d = self.decision
        return (
            self.seq,
            d.key,
            self.base_key,
            d.node,
            d.action.value,
            self.body or _encode(d),
            self.origin,
            self.status.value,
            self.attempts,
            int(self.sent),
            self.last_error,
            self.outcome,
            self.queued_at,
            self.done_at,
            self.boot,
        )

    def pending(self) -> Pending:
        return Pending(
            self.decision,
            self.attempts,
            self.last_error,
            self.seq,
            self.queued_at,
            self.origin,
            self.durable,
        )

    def record(self) -> Record:
        return Record(
            self.seq,
            self.decision,
            self.status,
            self.attempts,
            self.last_error,
            self.outcome,
            self.origin,
            self.queued_at,
            self.done_at,
        )


_COLUMNS = (
    "seq, key, base_key, node, action, body, origin, status, attempts, sent,"
    " last_error, outcome, queued_at, done_at, boot"
)
_UPSERT = (
    f"INSERT INTO decisions ({_COLUMNS}) VALUES ({', '.join('?' * 15)})"
    " ON CONFLICT(seq) DO UPDATE SET status = excluded.status, attempts = excluded.attempts,"
    " sent = excluded.sent, last_error = excluded.last_error, outcome = excluded.outcome,"
    " done_at = excluded.done_at"
)


def decision_from_dict(data: dict[str, Any]) -> Decision:
    """A decision from an outbox row's body (the model's fields, :func:`_encode`).

    Rows written before each assessment's own time was kept have none: it is
    the decision's. ValueError names a field that is wrong.
    """
    evidence = data.get("evidence", ())
    if isinstance(evidence, list) and any(isinstance(a, dict) and "at" not in a for a in evidence):
        at = data.get("at")
        data = {**data, "evidence": [a if "at" in a else {**a, "at": at} for a in evidence]}
    return from_data(data, Decision)


def _encode(decision: Decision) -> bytes:
    return orjson.dumps(to_data(decision))


def _decode(body: bytes, key: str) -> Decision:
    return replace(decision_from_dict(orjson.loads(body)), key=key)


# ---------------------------------------------------------------------- writer side


def _write_rows(db: sqlite3.Connection, rows: Sequence[tuple[Any, ...]]) -> None:
    with transaction(db):
        db.executemany(_UPSERT, rows)


def _prune(db: sqlite3.Connection) -> None:
    with transaction(db):
        db.execute(
            "DELETE FROM decisions WHERE status != ? AND seq NOT IN "
            "(SELECT seq FROM decisions WHERE status != ? ORDER BY seq DESC LIMIT ?) "
            "AND seq NOT IN (SELECT MAX(seq) FROM decisions GROUP BY node)",
            (Status.PENDING, Status.PENDING, KEEP_DONE_ROWS),
        )


def _row_from_db(row: tuple[Any, ...]) -> Row:
    (seq, key, base_key, _node, _action, body, origin, status, attempts, sent) = row[:10]
    last_error, outcome, queued_at, done_at, boot = row[10:]
    return Row(
        seq,
        _decode(body, key),
        base_key,
        origin,
        Status(status),
        queued_at,
        boot,
        attempts,
        bool(sent),
        last_error,
        outcome,
        done_at,
        version=1,
        stored=1,
        held=True,
    )


class DecisionStore:
    """Owns the outbox database: decisions, overrides and the audit trail.

    ``on_loop=True`` runs every statement on the calling thread instead of the
    writer thread (the bench compares both); nothing else should use it.
    """

    def __init__(
        self,
        path: Path | str,
        *,
        wall: Callable[[], float] = time.time,
        mono: Callable[[], float] = time.monotonic,
        on_loop: bool = False,
    ) -> None:
        self.path = str(path)
        self._wall = wall
        self._mono = mono
        self.boot = secrets.token_hex(6)  # makes every key unique across restarts
        self.wakeup = asyncio.Event()  # set when a row becomes deliverable
        self.inflight: int | None = None  # seq of the row being delivered (set by the deliverer)
        self._lock_fh: IO[bytes] | None = None
        self._pending: dict[int, Row] = {}
        self._latest: dict[str, Row] = {}
        self._confirmed: dict[str, Row] = {}
        self._failed: collections.deque[Row] = collections.deque(maxlen=KEEP_FAILED_IN_MEMORY)
        self._dirty: dict[int, Row] = {}
        self._next_seq = 1
        self._executor = (
            None if on_loop else ThreadPoolExecutor(1, thread_name_prefix="rackguard-store")
        )
        # Opening, migrating and loading run on the writer thread too (waited for
        # here, before the event loop runs): the connection has one thread.
        try:
            if self.path != MEMORY:
                self._lock_fh = take_lock(Path(self.path))
            self._db = self._on_writer(open_database, self.path)
        except BaseException:
            self._release_lock()
            if self._executor is not None:
                self._executor.shutdown()
            raise
        self._on_writer(self._load)
        self._outstanding: collections.deque[float] = collections.deque()  # start times
        self.write_error = ""  # the disk's refusal while it refuses, else ""
        self.probe_error = ""  # why a write could not start at the last probe, else ""
        self.write_failures = 0  # failed write transactions, for the metric
        self.commits = 0  # write transactions committed, for the bench
        self._stall_reported = False
        self.overrides_at_open: list[tuple[str, bytes]] = self._on_writer(
            lambda: list(self._db.execute("SELECT key, body FROM overrides"))
        )
        self.steering_at_open: list[tuple[Any, ...]] = self._on_writer(
            lambda: list(
                self._db.execute(
                    "SELECT node, target, original, written, writing, written_at, bucket"
                    " FROM steering"
                )
            )
        )
        log.info("outbox: %s", self.path if self.path != MEMORY else "in memory (not durable)")
        if self._pending:
            log.info("outbox %s: %d undelivered decision(s) carried over", self.path, len(self))

    def _on_writer(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn`` on the writer thread and wait for it (only before the loop runs)."""
        if self._executor is None:
            return fn(*args)
        return self._executor.submit(fn, *args).result()

    def __len__(self) -> int:
        return len(self._pending)

    def _release_lock(self) -> None:
        if self._lock_fh is not None:
            self._lock_fh.close()
            self._lock_fh = None

    def _load(self) -> None:
        db = self._db
        try:
            _prune(db)
        except sqlite3.Error as err:  # a full disk at start: prune next time
            log.debug("outbox %s: not pruned: %s", self.path, err)
        select = f"SELECT {_COLUMNS} FROM decisions"
        for row in db.execute(f"{select} WHERE status = ? ORDER BY seq", (Status.PENDING,)):
            r = _row_from_db(row)
            self._pending[r.seq] = r
        latest = "SELECT MAX(seq) FROM decisions"
        for row in db.execute(f"{select} WHERE seq IN ({latest} GROUP BY node) ORDER BY seq"):
            r = self._pending.get(row[0]) or _row_from_db(row)
            self._latest[r.decision.node] = r
        confirmed = f"{latest} WHERE status = ? GROUP BY node"
        for row in db.execute(f"{select} WHERE seq IN ({confirmed})", (Status.CONFIRMED,)):
            r = _row_from_db(row)
            self._confirmed[r.decision.node] = r
        failed = f"{select} WHERE status = ? ORDER BY seq DESC LIMIT ?"
        rows = db.execute(failed, (Status.FAILED, KEEP_FAILED_IN_MEMORY)).fetchall()
        self._failed.extend(_row_from_db(row) for row in reversed(rows))
        (top,) = db.execute("SELECT COALESCE(MAX(seq), 0) FROM decisions").fetchone()
        self._next_seq = int(top) + 1

    def close(self) -> None:
        """Write what can be written, close the database, release the lock.

        Pending rows stay for the next start; rows the disk refused until now are lost.
        """
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        if self._dirty:
            with contextlib.suppress(sqlite3.Error):
                _write_rows(self._db, [r.params() for r in self._dirty.values()])
                self._dirty.clear()
        if self._dirty:
            log.error(
                "outbox %s: stopping with %d decision change(s) the disk never took: lost",
                self.path,
                len(self._dirty),
            )
        self._db.close()
        self._release_lock()

    # ------------------------------------------------------------------ the writer thread

    def _call(self, fn: Callable[[sqlite3.Connection], T]) -> asyncio.Future[T]:
        """Run ``fn(db)`` on the writer thread (in order); the future has its result."""
        loop = asyncio.get_running_loop()
        if self._executor is None:
            fut: asyncio.Future[T] = loop.create_future()
            try:
                fut.set_result(fn(self._db))
            except Exception as err:
                fut.set_exception(err)
            return fut
        started = self._mono()
        self._outstanding.append(started)
        job = self._executor.submit(fn, self._db)

        def ended(_: object) -> None:
            # On the writer thread, once the statement is over: a read given up by its
            # caller (query's time limit) holds the disk as long as it runs, and counts
            # as outstanding, so a stall is still seen and said.
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self._outstanding.remove, started)

        job.add_done_callback(ended)
        return asyncio.wrap_future(job, loop=loop)

    async def query(
        self, fn: Callable[[sqlite3.Connection], T], timeout_s: float = READ_TIMEOUT_S
    ) -> T:
        """Run a read on the writer thread; StorageError on failure or past ``timeout_s``.

        A read queued behind a stalled write gives up rather than hold an API
        request for as long as the disk is frozen.
        """
        try:
            async with asyncio.timeout(timeout_s):
                return await self._call(fn)
        except TimeoutError as err:
            raise StorageError(
                f"outbox {self.path}: busy (a write is waiting for the disk)"
            ) from err
        except sqlite3.Error as err:
            raise StorageError(f"outbox {self.path}: {err}") from err

    def _flush(self) -> asyncio.Future[bool]:
        """Write every changed row; resolves True once durable, False if the disk refused."""
        snapshot = [(r, r.version) for r in self._dirty.values()]
        params = [r.params() for r, _ in snapshot]
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        if not snapshot:
            done.set_result(True)
            return done

        def write(db: sqlite3.Connection) -> None:
            _write_rows(db, params)

        def finished(fut: asyncio.Future[None]) -> None:
            err = fut.exception() if not fut.cancelled() else StorageError("cancelled")
            woke = False
            for row, version in snapshot:
                if not row.held:
                    row.held = woke = True
                if err is None:
                    row.stored = max(row.stored, version)
                    if row.durable:
                        self._dirty.pop(row.seq, None)
            if err is None:
                self.commits += 1
                self._recovered()
            else:
                self._refused(err)
            if woke:
                self.wakeup.set()
            # Its waiter may have been cancelled meanwhile (shutdown): the rows above
            # are recorded all the same, there is only nobody left to tell.
            if not done.done():
                done.set_result(err is None)

        self._call(write).add_done_callback(finished)
        return done

    def _refused(self, err: BaseException) -> None:
        self.write_failures += 1
        if not isinstance(err, sqlite3.Error | StorageError):
            log.error("outbox %s: unexpected error writing", self.path, exc_info=err)
        if not self.write_error:
            log.error(
                "outbox %s: cannot write (%s): decisions are still delivered, but held in "
                "memory only (not durable) until the disk takes writes again",
                self.path,
                err,
            )
        self.write_error = str(err) or type(err).__name__

    def _recovered(self) -> None:
        if self.write_error and not self._dirty:
            log.info("outbox %s: writable again; every decision is durable", self.path)
            self.write_error = ""

    async def run(self) -> None:
        """Until cancelled: offer rows held in memory to a failing disk again; report stalls."""
        while True:
            await asyncio.sleep(1.0 if not self.write_error else RETRY_S)
            if self._dirty and not self._outstanding:
                await self._flush()
            if not self._outstanding:
                self.probe_error = await self._call(probe)
            stalled = self.stalled_s()
            if stalled >= STALL_S and not self._stall_reported:
                log.error("outbox %s: a write has waited %.0fs: disk stalled?", self.path, stalled)
                self._stall_reported = True
            elif stalled < STALL_S and self._stall_reported:
                log.info("outbox %s: writes complete again", self.path)
                self._stall_reported = False

    def stalled_s(self) -> float:
        """How long the oldest outstanding write has waited (0 when none)."""
        return self._mono() - self._outstanding[0] if self._outstanding else 0.0

    def health(self) -> list[tuple[bool, str]]:
        """(ok, reason) for /readyz; never touches the disk."""
        checks: list[tuple[bool, str]] = []
        if self.write_error:
            checks.append(
                (
                    False,
                    f"outbox {self.path}: cannot write ({self.write_error}); "
                    f"{self.not_durable()} decision change(s) held in memory only",
                )
            )
        if self.probe_error:
            checks.append((False, f"outbox {self.path}: a write cannot start: {self.probe_error}"))
        stalled = self.stalled_s()
        if stalled >= STALL_S:
            checks.append((False, f"outbox {self.path}: a write has waited {stalled:.0f}s"))
        return checks or [(True, f"outbox {self.path}: writable")]

    @property
    def error(self) -> str:
        """Why the outbox cannot take writes now, or ""."""
        return self.write_error or self.probe_error

    def not_durable(self) -> int:
        """Rows whose current state the database does not hold yet."""
        return sum(1 for r in self._dirty.values() if r.held)

    # ------------------------------------------------------------------ queries (memory)

    def pending(self) -> list[Pending]:
        """Decisions not yet confirmed, oldest first (the backlog)."""
        return [r.pending() for r in self._pending.values()]

    def intents(self) -> dict[str, Decision]:
        """Per node, the newest decision: the state rackguard intends the node to be in."""
        return {node: r.decision for node, r in self._latest.items()}

    def latest(self, node: str) -> Record | None:
        """The node's newest decision and where its delivery stands (None: none yet)."""
        row = self._latest.get(node)
        return row.record() if row else None

    @property
    def confirmed(self) -> dict[str, Action]:
        """Per node, the newest action the scheduler confirmed."""
        return {node: r.decision.action for node, r in self._confirmed.items()}

    @property
    def failed(self) -> list[tuple[Decision, str]]:
        """The latest decisions refused for good, oldest first, with the error."""
        return [(r.decision, r.last_error) for r in self._failed]

    def busy_nodes(self) -> set[str]:
        """Nodes with a decision pending or being delivered: the reconciler leaves them be."""
        return {r.decision.node for r in self._pending.values()}

    def next_ready(self) -> Row | None:
        """The oldest pending row whose write was tried: the next one to deliver."""
        for row in self._pending.values():
            return row if row.held else None
        return None

    # ------------------------------------------------------------------ queries (database)

    async def history(self, limit: int = 100) -> list[Record]:
        """The newest ``limit`` rows, newest first (rows held in memory included)."""

        def read(db: sqlite3.Connection) -> list[tuple[Any, ...]]:
            sql = f"SELECT {_COLUMNS} FROM decisions ORDER BY seq DESC LIMIT ?"
            return db.execute(sql, (limit,)).fetchall()

        rows = {r.seq: r for r in map(_row_from_db, await self.query(read))}
        rows.update(self._dirty)
        return [rows[seq].record() for seq in sorted(rows, reverse=True)[:limit]]

    async def submitted_count(self) -> int:
        """How many decisions were ever submitted (and kept), reconciler repairs excluded."""

        def read(db: sqlite3.Connection) -> int:
            sql = "SELECT COUNT(*) FROM decisions WHERE origin = 'policy'"
            return int(db.execute(sql).fetchone()[0])

        return await self.query(read)

    # ------------------------------------------------------------------ writes

    def submit(self, decision: Decision) -> asyncio.Future[str | None]:
        """Store a decision and queue it; the future resolves to the key it is stored under.

        It resolves once the row is durable, or held in memory when the disk
        refuses; ordering is the order of the calls. A newer decision for the
        same node supersedes an undelivered one. Dry-run decisions are not
        stored: None.
        """
        out: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        if decision.dry_run:
            out.set_result(None)
            return out
        key = self._insert(decision, decision.key, origin="policy")

        def stored(_: asyncio.Future[bool]) -> None:
            if not out.done():  # not cancelled by its waiter meanwhile (shutdown)
                out.set_result(key)

        self._flush().add_done_callback(stored)
        return out

    def enqueue_repair(self, intent: Decision, note: str) -> str | None:
        """Queue the intent again because the scheduler drifted from it (reconciliation).

        Does nothing (None) when a newer decision or a pending one exists for the node.
        """
        latest = self._latest.get(intent.node)
        if latest is None or latest.decision.key != intent.key or latest.status is Status.PENDING:
            return None
        log.warning("%s: %s; re-applying %s", intent.node, note, intent.action)
        key = self._insert(intent, latest.base_key, origin="reconcile")
        self._flush()
        return key

    def _insert(self, decision: Decision, base: str, *, origin: str) -> str:
        node = decision.node
        now = self._wall()
        seq = self._next_seq
        self._next_seq += 1
        # The policy's keys repeat after a restart (its epoch starts again) and a
        # repair re-queues an intent: the boot id and the row make each key unique.
        key = f"{base}-{self.boot}-{seq}"
        waiting = [r for r in self._pending.values() if r.decision.node == node]
        replaceable = [r for r in waiting if r.seq != self.inflight]
        for r in replaceable:
            self._settle(r, Status.SUPERSEDED, f"superseded by {decision.action}", now=now)
            log.info("%s: %s supersedes undelivered %s", node, decision.action, r.decision.action)
        status, outcome = Status.PENDING, ""
        # A row whose write was started may have reached the scheduler before a
        # crash or a timeout: then the new decision is needed whatever was confirmed.
        maybe_sent = len(replaceable) < len(waiting) or any(r.sent for r in replaceable)
        if replaceable and not maybe_sent:
            # e.g. a drain then a resume, neither delivered: the scheduler
            # never saw the drain, so the resume is not needed either.
            last = self._confirmed.get(node)
            if decision.action is (last.decision.action if last else Action.RESUME):
                status, outcome = Status.SUPERSEDED, "nothing left to send"
                log.info("%s: %s: nothing left to send", node, decision.action)
        row = Row(
            seq,
            replace(decision, key=key),
            base,
            origin,
            status,
            now,
            self.boot,
            outcome=outcome,
            done_at=None if status is Status.PENDING else now,
        )
        row.body = _encode(row.decision)
        self._latest[node] = row
        self._dirty[seq] = row
        if status is Status.PENDING:
            self._pending[seq] = row
        return key

    def _settle(self, row: Row, status: Status, outcome: str, *, now: float) -> None:
        row.status, row.outcome, row.done_at = status, outcome, now
        row.version += 1
        self._dirty[row.seq] = row
        self._pending.pop(row.seq, None)
        if status is Status.CONFIRMED:
            self._confirmed[row.decision.node] = row
        elif status is Status.FAILED:
            self._failed.append(row)

    # ------------------------------------------------------------------ the deliverer's writes

    def count_attempt(self, row: Row) -> None:
        """One more delivery attempt (stored with the next write of the row)."""
        row.attempts += 1
        row.version += 1
        self._dirty[row.seq] = row

    async def mark_sent(self, row: Row) -> None:
        """Note durably, before writing, that the scheduler may see this row from now on."""
        row.sent = True
        row.version += 1
        self._dirty[row.seq] = row
        await self._flush()

    async def record_error(self, row: Row, error: str) -> None:
        """A failed attempt's error, for /v1/outbox."""
        row.last_error = error
        row.version += 1
        self._dirty[row.seq] = row
        await self._flush()

    async def finish(self, row: Row, status: Status, outcome: str, error: str = "") -> None:
        """Settle a delivered row: confirmed, skipped or failed."""
        if row.status is not Status.PENDING:
            return
        row.last_error = error or row.last_error
        self._settle(row, status, outcome, now=self._wall())
        await self._flush()

    # ------------------------------------------------------------------ helpers for other tables

    async def write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` in one write transaction on the writer thread; StorageError on failure."""

        def run(db: sqlite3.Connection) -> T:
            with transaction(db):
                return fn(db)

        try:
            result = await self._call(run)
        except sqlite3.Error as err:
            self.write_failures += 1
            raise StorageError(f"outbox {self.path}: {err}") from err
        self.commits += 1
        return result


def pending_summary(items: Iterable[Pending]) -> str:
    """``gpu01 drain, gpu02 resume`` for logs."""
    return ", ".join(f"{p.decision.node} {p.decision.action}" for p in items)
