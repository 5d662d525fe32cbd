"""Job notices: once a drain or exclusion is applied, tell the node's running jobs, then requeue.

A drain only stops new work. The lead time is only worth something if the job
already on the node hears of it: so, when the deliverer confirms a drain or an
exclusion (read back from the scheduler), a *notice* opens with a deadline
("checkpoint by T": ``checkpoint_grace_s`` after a drain, ``critical_grace_s``
after an exclusion), and

1. every job running on the node is told — sent the configured signal (Slurm),
   annotated with its deadline and given an Event (Kubernetes pods) — once per
   job per notice; a job the scheduler could not be asked about is asked again;
2. at the deadline, every job still running is requeued (Slurm) or evicted
   (Kubernetes) where the scheduler allows it; one that cannot be requeued is
   left running, and logged; one the scheduler says "not now" about (a
   PodDisruptionBudget's 429) is asked again with backoff until it goes;
3. a resume confirmed before the deadline closes the notice: nothing is
   requeued, and what can be taken back is (a pod's annotation; a signal
   cannot be), once, as far as the scheduler can be reached then.

Each step is written to the decision store's database (tables ``notices`` and
``notice_jobs``) before it is taken: a job's row is written before its signal
is sent, so after a restart or ``kill -9`` a job is never signalled twice (one
whose signal was in flight at the crash is logged, not signalled again), and an
open notice is resumed, its requeue still due. A notice that cannot be written
(disk full) waits: no signal is sent that could be repeated.

A new drain or exclusion for a node with an open notice keeps that notice (a
repair by the reconciler, a restart) — an exclusion only brings its deadline
forward, and the jobs already told are told the new deadline where the
scheduler carries one (a pod's annotation; ``JobControl.revise``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import sqlite3
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial

from adapters.schedulers.jobs import (
    JobControl,
    JobControlError,
    NoticeTerms,
    Outcome,
    RunningJob,
)
from daemon.delivery.deliverer import REFUSED_SLOWDOWN, Sleep, wait_or_wake
from daemon.delivery.outbox import DecisionStore, Status, StorageError
from daemon.poller import capped_backoff
from policies.model import Action, Decision

log = logging.getLogger(__name__)

KEEP_CLOSED = 200  # closed notices kept in memory (and on disk) for the API
STORAGE_RETRY_S = 5.0  # a notice the disk refused is offered again this often
IN_FLIGHT = "unknown: the daemon stopped while signalling; not signalled again"
FAILED = "failed"  # a job's step the scheduler refused for good: "failed: <why>"


@dataclass(frozen=True, slots=True)
class NoticeSettings:
    """How jobs are told and how long they get."""

    signal: str = "USR1"  # how jobs are told ("annotation": pods); "": not (the endpoint only)
    checkpoint_grace_s: float = 540.0  # after a drain
    critical_grace_s: float = 20.0  # after an exclusion
    requeue: bool = True
    retry_initial_s: float = 1.0
    retry_max_s: float = 30.0


@dataclass(slots=True)
class JobNote:
    """One job on a notice: whether and how it was told, whether it was requeued."""

    job_id: str
    name: str = ""
    user: str = ""
    signal: str = ""
    signal_started_at: float | None = None
    signaled: str = ""  # the outcome ("done", "gone", "refused: ...") once known
    requeued_at: float | None = None
    requeued: str = ""
    # Its own deadline, where it is not the notice's (a pod that appeared after the tell).
    deadline: float | None = None
    # Not stored: a failed step of this job alone is asked again on its own schedule.
    retry_at: float = 0.0
    failures: int = 0
    error: str = ""  # why its last step failed ("" once it went through)

    @property
    def requeue(self) -> tuple[float | None, str, float | None]:
        """requeued_at, requeued, deadline: the columns that change with the requeue."""
        return self.requeued_at, self.requeued, self.deadline

    @property
    def told(self) -> bool:
        """Told (or being told) this notice, or failed to be for good."""
        return self.signal_started_at is not None or self.signaled.startswith(FAILED)

    @property
    def settled(self) -> bool:
        """Nothing more to do at the deadline: moved, gone, refused, or failed for good."""
        return bool(self.requeued) and not self.requeued.startswith(Outcome.BLOCKED)


@dataclass(slots=True)
class Notice:
    """A drain or exclusion's notice to the jobs of one node."""

    key: str  # the decision's key
    node: str
    action: Action
    reason: str
    domain: str
    noticed_at: float
    deadline: float  # "checkpoint by"
    told_at: float | None = None  # every job running at the notice was signalled
    closed_at: float | None = None
    closed: str = ""  # why it closed: "requeued", "resumed before the deadline"
    jobs: dict[str, JobNote] = field(default_factory=dict)
    retry_at: float = 0.0  # wall clock: after a failed step, not before
    failures: int = 0
    error: str = ""  # why the last step failed ("" once it went through): for the API

    @property
    def ends(self) -> tuple[float | None, float | None, str]:
        """told_at, closed_at, closed: the columns that change."""
        return self.told_at, self.closed_at, self.closed

    @property
    def open(self) -> bool:
        return self.closed_at is None


@dataclass(slots=True)
class NoticeCounts:
    """What the notices did since the daemon started, for /metrics.

    ``opened`` by action (drain, exclude); ``signals`` and ``requeues`` by
    result (done, gone, refused; a signal in flight at a crash: unknown);
    ``retries``: failed steps by reason (unreachable, auth, ..., storage).
    """

    opened: Counter[str] = field(default_factory=Counter)
    signals: Counter[str] = field(default_factory=Counter)
    requeues: Counter[str] = field(default_factory=Counter)
    retries: Counter[str] = field(default_factory=Counter)


_NOTICE_COLS = "key, node, action, reason, domain, noticed_at, deadline, told_at, closed_at, closed"
_JOB_COLS = (
    "notice, job_id, name, user, signal, signal_started_at, signaled, requeued_at, requeued,"
    " deadline"
)


def _put_notice(db: sqlite3.Connection, n: Notice) -> None:
    db.execute(
        f"INSERT INTO notices ({_NOTICE_COLS}) VALUES (?,?,?,?,?,?,?,?,?,?) "
        "ON CONFLICT(key) DO UPDATE SET deadline = excluded.deadline, told_at = excluded.told_at,"
        " closed_at = excluded.closed_at, closed = excluded.closed",
        (n.key, n.node, n.action.value, n.reason, n.domain, n.noticed_at, n.deadline, *n.ends),
    )


def _put_job(db: sqlite3.Connection, key: str, j: JobNote) -> None:
    db.execute(
        f"INSERT INTO notice_jobs ({_JOB_COLS}) VALUES (?,?,?,?,?,?,?,?,?,?) "
        "ON CONFLICT(notice, job_id) DO UPDATE SET signal = excluded.signal,"
        " signal_started_at = excluded.signal_started_at, signaled = excluded.signaled,"
        " requeued_at = excluded.requeued_at, requeued = excluded.requeued,"
        " deadline = excluded.deadline",
        (key, j.job_id, j.name, j.user, j.signal, j.signal_started_at, j.signaled, *j.requeue),
    )


def _load(db: sqlite3.Connection) -> list[Notice]:
    notices: dict[str, Notice] = {}
    rows = db.execute(
        f"SELECT {_NOTICE_COLS} FROM notices WHERE closed_at IS NULL OR key IN "
        "(SELECT key FROM notices WHERE closed_at IS NOT NULL ORDER BY noticed_at DESC LIMIT ?)"
        " ORDER BY noticed_at",
        (KEEP_CLOSED,),
    )
    for key, node, action, reason, domain, at, deadline, told, closed_at, closed in rows:
        notices[key] = Notice(
            key, node, Action(action), reason, domain, at, deadline, told, closed_at, closed
        )
    for row in db.execute(f"SELECT {_JOB_COLS} FROM notice_jobs"):
        notice = notices.get(row[0])
        if notice is not None:
            notice.jobs[row[1]] = JobNote(*row[1:])
    return list(notices.values())


def _prune(db: sqlite3.Connection) -> None:
    old = (
        "SELECT key FROM notices WHERE closed_at IS NOT NULL "
        "ORDER BY noticed_at DESC LIMIT -1 OFFSET ?"
    )
    db.execute(f"DELETE FROM notice_jobs WHERE notice IN ({old})", (KEEP_CLOSED,))
    db.execute(f"DELETE FROM notices WHERE key IN ({old})", (KEEP_CLOSED,))


class JobNotices:
    """Opens a notice per applied drain/exclusion and carries it to its end; one task."""

    def __init__(
        self,
        store: DecisionStore,
        jobs: JobControl,
        settings: NoticeSettings,
        *,
        wall: Callable[[], float] = time.time,
        sleep: Sleep = wait_or_wake,
    ) -> None:
        self._store = store
        self._jobs = jobs
        self.settings = settings
        self._wall = wall
        self._sleep = sleep
        self._notices: dict[str, Notice] = {}
        self._inbox: list[Decision] = []  # settled decisions not yet looked at
        self._wake = asyncio.Event()
        self.loaded = asyncio.Event()
        self.signals_sent = 0  # signals sent by this process (tests, metrics)
        self.counts = NoticeCounts()
        # Called after a notice opens, changes (a job told or requeued) or closes.
        self.on_change: Callable[[Notice], object] | None = None

    # ------------------------------------------------------------------ input

    def settled(self, decision: Decision, status: Status, outcome: str) -> None:
        """The deliverer's on_settled: a confirmed decision may open or close a notice."""
        if status is Status.CONFIRMED:
            self._inbox.append(decision)
            self._wake.set()

    # ------------------------------------------------------------------ output

    def current(self, node: str) -> Notice | None:
        """The open notice of ``node``, if any."""
        for n in reversed(self._notices.values()):
            if n.node == node and n.open:
                return n
        return None

    @property
    def scheduler(self) -> str:
        """The scheduler whose jobs are told (a metric label)."""
        return self._jobs.name

    def open_count(self) -> int:
        """Notices whose jobs are still to be told or requeued."""
        return sum(1 for n in self._notices.values() if n.open)

    def all(self) -> list[Notice]:
        """Every notice kept, newest first."""
        return sorted(self._notices.values(), key=lambda n: n.noticed_at, reverse=True)

    # ------------------------------------------------------------------ the task

    async def run(self) -> None:
        """Until cancelled: load open notices, then carry each to its end."""
        for n in await self._load():
            self._notices[n.key] = n
            for job in n.jobs.values():
                if job.signal_started_at is not None and not job.signaled:
                    job.signaled = IN_FLIGHT
                    self.counts.signals["unknown"] += 1
                    log.warning("%s: job %s: %s", n.node, job.job_id, IN_FLIGHT)
        if any(n.open for n in self._notices.values()):
            log.info(
                "job notices: %d open notice(s) carried over",
                sum(1 for n in self._notices.values() if n.open),
            )
        self.loaded.set()
        while True:
            await self._take_inbox()
            now = self._wall()
            due = math.inf
            for n in [n for n in self._notices.values() if n.open]:
                if self.next_at(n) <= now:
                    await self._advance(n)
                if n.open:
                    due = min(due, self.next_at(n))
            if self._inbox:
                continue
            self._wake.clear()
            delay = max(0.0, due - self._wall()) if due != math.inf else 3600.0
            await self._sleep(delay, self._wake)

    async def _load(self) -> list[Notice]:
        # A disk stalled at start delays the notices; it never ends the daemon.
        failures = 0
        while True:
            try:
                return await self._store.query(_load)
            except StorageError as err:
                failures += 1
                level = logging.ERROR if failures == 1 else logging.DEBUG
                log.log(level, "job notices: cannot read the open notices, retrying: %s", err)
                await self._sleep(STORAGE_RETRY_S, asyncio.Event())

    async def _take_inbox(self) -> None:
        failures = 0
        while self._inbox:
            decision = self._inbox[0]
            try:
                await self._on_confirmed(decision)
            except StorageError as err:
                failures += 1
                level = logging.ERROR if failures == 1 else logging.DEBUG
                log.log(level, "%s: notice not recorded, retrying: %s", decision.node, err)
                self._wake.clear()
                await self._sleep(min(self.settings.retry_max_s, STORAGE_RETRY_S), self._wake)
                continue
            self._inbox.pop(0)

    async def _on_confirmed(self, d: Decision) -> None:
        now = self._wall()
        current = self.current(d.node)
        if d.action is Action.RESUME:
            if current is not None:
                await self._close(current, "resumed before the deadline")
                log.info("%s: resumed before the deadline; no job requeued", d.node)
                await self._withdraw(current)
            return
        grace = self._grace(d.action)
        deadline = now + grace
        if current is not None:
            if deadline < current.deadline:
                current.deadline = deadline
                for job in current.jobs.values():  # a late pod's own deadline too
                    if job.deadline is not None and job.deadline > deadline:
                        job.deadline = None
                        await self._save(current, partial(_put_job, key=current.key, j=job))
                current.told_at = None  # the jobs told are told the new deadline
                await self._save(current, partial(_put_notice, n=current))
                log.info("%s: %s brings the jobs' deadline forward", d.node, d.action)
            return
        notice = Notice(d.key, d.node, d.action, d.reason, d.domain.value, now, deadline)
        await self._save(notice, partial(_put_notice, n=notice))
        self._notices[notice.key] = notice
        self.counts.opened[d.action.value] += 1
        log.info("%s: %s applied; running jobs to checkpoint within %.0fs", d.node, d.action, grace)

    async def _advance(self, n: Notice) -> None:
        """One pass over the node's jobs: each told, moved or asked again on its own."""
        try:
            await self._pass(n)
        except (JobControlError, StorageError) as err:
            # The node's list (or the disk) failed: nothing can be done for any job.
            n.failures += 1
            self.counts.retries[err.reason if isinstance(err, JobControlError) else "storage"] += 1
            delay = capped_backoff(
                self.settings.retry_initial_s, self.settings.retry_max_s, n.failures
            )
            # A refusal an operator must fix (RBAC) is asked about far less often.
            refused = isinstance(err, JobControlError) and err.permanent
            delay *= REFUSED_SLOWDOWN if refused else 1.0
            n.retry_at = self._wall() + delay
            first = logging.ERROR if refused else logging.WARNING
            if str(err) != n.error:
                n.error = str(err)
                self._changed(n)
            level = first if n.failures == 1 else logging.DEBUG
            log.log(level, "%s: job notice: %s; retry in %.0fs", n.node, err, delay)
            return

    def next_at(self, n: Notice) -> float:
        """When the notice has something to do next (wall clock)."""
        if n.retry_at and n.failures:
            return n.retry_at  # the node's list failed: nothing before then
        if n.told_at is None:
            return 0.0
        due = [n.deadline]
        for j in n.jobs.values():
            if j.retry_at and j.error:
                due.append(j.retry_at)
            elif not j.settled:
                due.append(self._deadline(n, j))
        return min(due)

    @staticmethod
    def _deadline(n: Notice, j: JobNote) -> float:
        return j.deadline if j.deadline is not None else n.deadline

    async def _pass(self, n: Notice) -> None:
        now = self._wall()
        signal = self.settings.signal
        terms = NoticeTerms(signal, n.deadline, n.reason, n.domain)
        listed = await self._jobs.running(n.node)
        if n.failures:
            log.info("%s: job notice: %s reachable again", n.node, self._jobs.name)
        n.failures = 0
        for job in listed:
            note = n.jobs.get(job.job_id)
            if note is not None and note.retry_at > now:
                continue  # on its own schedule
            try:
                if signal and (note is None or not note.told):
                    note = await self._tell_one(n, job, note, terms, now)
                    if n.told_at is not None and now < self._deadline(n, note):
                        continue  # told now; moved at its own deadline, not in this pass
                elif signal and n.told_at is None and note and note.signal_started_at:
                    await self._revise_one(n, job, note, terms)
                if now >= self._deadline(n, note or JobNote(job.job_id)) and self.settings.requeue:
                    await self._requeue_one(n, job, n.jobs.get(job.job_id))
            except JobControlError as err:
                await self._job_failed(n, job, err)
            else:
                note = n.jobs.get(job.job_id)
                if note is not None and note.error:
                    note.error, note.failures, note.retry_at = "", 0, 0.0
                    log.info("%s: job %s: through at last", n.node, job.shown)
        # The notice's own schedule is its jobs': the earliest retry of one that failed.
        pending = [j.retry_at for j in n.jobs.values() if j.error and j.retry_at > self._wall()]
        n.retry_at = min(pending, default=0.0)
        error = "; ".join(f"{j.job_id}: {j.error}" for j in n.jobs.values() if j.error)
        if error != n.error:
            n.error = error
            self._changed(n)
        if n.told_at is None:
            # Shown as told only once that is on disk (a restart must not tell again).
            await self._store.write(partial(_put_notice, n=replace(n, told_at=now)))
            n.told_at = now
            self._changed(n)
        ids = {job.job_id for job in listed}
        waiting = [j for j in n.jobs.values() if j.job_id in ids and not j.settled]
        if not self.settings.requeue:
            waiting = []  # nothing to do at the deadline
        if now >= n.deadline and not any(now < self._deadline(n, j) or j.error for j in waiting):
            await self._close(n, self._why(n, ids))

    async def _tell_one(
        self, n: Notice, job: RunningJob, note: JobNote | None, terms: NoticeTerms, now: float
    ) -> JobNote:
        if note is None:
            note = JobNote(job.job_id, job.name, job.user)
            if n.told_at is not None:
                # Landed after the tell: told first, and given the grace from now,
                # bounded by the notice's own kind (an exclusion's critical grace).
                note.deadline = max(n.deadline, now + self._grace(n.action))
                terms = NoticeTerms(terms.signal, note.deadline, terms.reason, terms.domain)
        elif note.deadline is not None:
            terms = NoticeTerms(terms.signal, note.deadline, terms.reason, terms.domain)
        note.signal = terms.signal
        note.signal_started_at = self._wall()
        # Durable before the signal: a restart never sends it twice.
        await self._save(n, partial(_put_job, key=n.key, j=note))
        n.jobs[job.job_id] = note
        try:
            outcome, said = await self._jobs.notify(job, terms)
        except JobControlError as err:
            # The scheduler said it could not: not told; asked again unless for good.
            note.signal_started_at = None
            if err.permanent:
                note.signaled = f"{FAILED}: {err}"
                self.counts.signals[FAILED] += 1
            await self._save(n, partial(_put_job, key=n.key, j=note))
            raise
        self.signals_sent += outcome is Outcome.DONE
        self.counts.signals[outcome.value] += 1
        note.signaled = outcome.value if outcome is Outcome.DONE else f"{outcome}: {said}"
        await self._save(n, partial(_put_job, key=n.key, j=note))
        log.info(
            "%s: job %s (%s) told (%s): %s; checkpoint by %s",
            n.node,
            job.shown,
            job.user,
            f"SIG{terms.signal}" if terms.signal.isupper() else terms.signal,
            note.signaled,
            time.strftime("%H:%M:%SZ", time.gmtime(terms.checkpoint_by)),
        )
        return note

    async def _revise_one(
        self, n: Notice, job: RunningJob, known: JobNote, terms: NoticeTerms
    ) -> None:
        # Told before: of an earlier deadline, or a crash came between.
        if known.deadline is not None:
            terms = NoticeTerms(terms.signal, known.deadline, terms.reason, terms.domain)
        outcome, _ = await self._jobs.revise(job, terms)
        if known.signaled == IN_FLIGHT and outcome is not Outcome.REFUSED:
            known.signaled = outcome.value  # checked, and completed
            await self._save(n, partial(_put_job, key=n.key, j=known))

    async def _requeue_one(self, n: Notice, job: RunningJob, note: JobNote | None) -> None:
        if note is None:
            note = JobNote(job.job_id, job.name, job.user)
        if note.settled:
            return  # moved, refused or failed for good: logged once
        n.jobs[job.job_id] = note
        try:
            outcome, said = await self._jobs.requeue(job)
        except JobControlError as err:
            if err.permanent:
                note.requeued_at = self._wall()
                note.requeued = f"{FAILED}: {err}"
                self.counts.requeues[FAILED] += 1
                await self._save(n, partial(_put_job, key=n.key, j=note))
            raise
        self.counts.requeues[outcome.value] += 1
        note.requeued_at = self._wall()
        note.requeued = outcome.value if outcome is Outcome.DONE else f"{outcome}: {said}"
        await self._save(n, partial(_put_job, key=n.key, j=note))
        if outcome is Outcome.BLOCKED:
            # Not now (a disruption budget): asked again with backoff, never forced.
            raise JobControlError(f"not yet: {job.job_id} ({said})", reason="blocked")
        if outcome is Outcome.REFUSED:
            log.warning(
                "%s: job %s (%s) cannot be requeued, left running: %s",
                n.node,
                job.shown,
                job.user,
                said,
            )
        else:
            log.info("%s: job %s (%s) requeued: %s", n.node, job.shown, job.user, said)

    async def _job_failed(self, n: Notice, job: RunningJob, err: JobControlError) -> None:
        """One job's step failed: recorded on that job, asked again on its own schedule."""
        note = n.jobs.get(job.job_id)
        if note is None:  # failed before anything was written for it
            note = n.jobs[job.job_id] = JobNote(job.job_id, job.name, job.user)
        self.counts.retries[err.reason] += 1
        if note.signaled.startswith(FAILED) and not note.requeued and not note.error:
            # Told for good that it cannot be told: moved at the deadline all the same.
            log.error("%s: job %s (%s) cannot be told: %s", n.node, job.shown, job.user, err)
            self._changed(n)
            return
        if note.requeued.startswith(FAILED):
            log.error("%s: job %s (%s) cannot be moved: %s", n.node, job.shown, job.user, err)
            note.error, note.retry_at = "", 0.0
            self._changed(n)
            return
        note.failures += 1
        delay = capped_backoff(
            self.settings.retry_initial_s, self.settings.retry_max_s, note.failures
        )
        note.retry_at = self._wall() + delay
        note.error = str(err)
        level = logging.WARNING if note.failures == 1 else logging.DEBUG
        log.log(level, "%s: job %s: %s; retry in %.0fs", n.node, job.shown, err, delay)
        self._changed(n)

    def _why(self, n: Notice, running: set[str]) -> str:
        why = "requeued" if self.settings.requeue else "deadline passed"
        left = [j.job_id for j in n.jobs.values() if j.requeued.startswith(Outcome.REFUSED)]
        failed = [
            f"{j.job_id} ({j.requeued.removeprefix(FAILED + ': ')})"
            for j in n.jobs.values()
            if j.requeued.startswith(FAILED) and j.job_id in running
        ]
        if left:
            why += f"; left running (the scheduler refused to requeue): {', '.join(left)}"
        if failed:
            why += f"; could not be moved: {'; '.join(failed)}"
        return why

    def _grace(self, action: Action) -> float:
        if action is Action.EXCLUDE:
            return self.settings.critical_grace_s
        return self.settings.checkpoint_grace_s

    async def _withdraw(self, n: Notice) -> None:
        # Best effort, once per job: one refusal never keeps the others' annotations.
        for note in n.jobs.values():
            if note.signal_started_at is None:
                continue
            job = RunningJob(note.job_id, note.name, note.user, node=n.node)
            try:
                outcome, said = await self._jobs.revise(job, None)
            except JobControlError as err:
                self.counts.retries[err.reason] += 1
                log.warning(
                    "%s: job %s: the notice could not be taken back: %s", n.node, job.job_id, err
                )
                continue
            log.debug("%s: job %s: notice taken back: %s %s", n.node, job.job_id, outcome, said)

    async def close(self) -> None:
        """Release what the scheduler's job control holds (an HTTP session)."""
        close = getattr(self._jobs, "close", None)
        if close is not None:
            await close()

    async def _save(self, n: Notice, fn: Callable[[sqlite3.Connection], None]) -> None:
        await self._store.write(fn)
        self._changed(n)

    def _changed(self, n: Notice) -> None:
        if self.on_change is not None:
            self.on_change(n)

    async def _close(self, n: Notice, why: str) -> None:
        n.closed_at, n.closed = self._wall(), why

        def write(db: sqlite3.Connection) -> None:
            _put_notice(db, n)
            _prune(db)

        try:
            await self._save(n, write)
        except StorageError:
            n.closed_at, n.closed = None, ""  # still open: the step is taken again
            raise
        closed = [k for k, v in self._notices.items() if not v.open]
        for key in closed[:-KEEP_CLOSED]:
            del self._notices[key]
