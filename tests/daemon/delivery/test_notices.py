"""Job notices and the decision store: schema 2, restarts, a disk that refuses, resume and exclude.

Slurm itself is in tests/adapters/schedulers/slurm/test_slurm_jobs.py (real batch
jobs). Here the scheduler's side is a scripted JobControl, because what is
tested is the store's: a disk that refuses a write, a restart with a signal in
flight — neither of which a real slurmctld can be made to time.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from adapters.schedulers.jobs import NoticeTerms, Outcome, RunningJob
from daemon.delivery.notices import IN_FLIGHT, JobNotices, NoticeSettings
from daemon.delivery.outbox import DecisionStore, Status
from daemon.loops import keep_running
from policies.model import Action
from tests.support.delivery import decision, notices_on
from tests.support.faulty_disk import FlakyDisk
from tests.support.scripted_jobs import ScriptedJobs
from tests.support.stray_cancel import CancelledWithResult
from tests.support.wait import wait_until

FAST = NoticeSettings(
    checkpoint_grace_s=0.3, critical_grace_s=0.1, retry_initial_s=0.02, retry_max_s=0.05
)


def test_a_version_1_outbox_gets_the_notice_tables(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "o.db"
    DecisionStore(path).close()
    db = sqlite3.connect(path)
    db.executescript("DROP TABLE notices; DROP TABLE notice_jobs; PRAGMA user_version = 1;")
    db.close()
    caplog.set_level("INFO")
    DecisionStore(path).close()
    db = sqlite3.connect(path)
    tables = {n for (n,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"notices", "notice_jobs", "decisions"} <= tables
    assert "schema migrated from version 1 to 2" in caplog.text


async def test_jobs_are_told_once_and_requeued_once_across_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "o.db"
    jobs = ScriptedJobs({"gpu01": ["11", "12"]})
    store = DecisionStore(path)
    slow = NoticeSettings(checkpoint_grace_s=3600.0)
    async with notices_on(store, jobs, slow) as n:
        n.settled(decision("gpu01", Action.DRAIN), Status.CONFIRMED, "read back")
        await wait_until(lambda: (c := n.current("gpu01")) is not None and c.told_at, what="told")
    store.close()
    assert jobs.signals == ["11", "12"] and not jobs.requeues
    # The next process: the deadline is in the database; make it due now.
    db = sqlite3.connect(path)
    db.execute("UPDATE notices SET deadline = 0")
    db.commit()
    db.close()
    store = DecisionStore(path)
    async with notices_on(store, jobs, slow) as n:
        await wait_until(lambda: n.current("gpu01") is None, what="requeued after the restart")
        (notice,) = n.all()
    store.close()
    assert jobs.signals == ["11", "12"]  # not told again
    assert jobs.requeues == ["11", "12"]
    assert notice.closed == "requeued" and [j.requeued for j in notice.jobs.values()] == [
        "done",
        "done",
    ]


async def test_a_signal_in_flight_at_a_crash_is_not_sent_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "o.db"
    jobs = ScriptedJobs({"gpu01": ["11"]})
    store = DecisionStore(path)
    async with notices_on(store, jobs, NoticeSettings(checkpoint_grace_s=3600.0)) as n:
        n.settled(decision("gpu01", Action.DRAIN), Status.CONFIRMED, "read back")
        await wait_until(lambda: (c := n.current("gpu01")) is not None and c.told_at)
    store.close()
    # As a kill -9 between "about to signal" and "signalled" leaves it:
    db = sqlite3.connect(path)
    db.execute("UPDATE notice_jobs SET signaled = ''")
    db.execute("UPDATE notices SET told_at = NULL")
    db.commit()
    db.close()
    store = DecisionStore(path)
    async with notices_on(store, jobs, NoticeSettings(checkpoint_grace_s=3600.0)) as n:
        await wait_until(lambda: (c := n.current("gpu01")) is not None and c.told_at)
        notice = n.current("gpu01")
    store.close()
    assert notice is not None and notice.jobs["11"].signaled == IN_FLIGHT
    assert jobs.signals == ["11"]
    assert "not signalled again" in caplog.text


async def test_no_signal_while_the_disk_refuses_then_exactly_one(tmp_path: Path) -> None:
    store = DecisionStore(tmp_path / "o.db")
    disk = FlakyDisk(store._db)
    store._db = disk  # type: ignore[assignment]
    jobs = ScriptedJobs({"gpu01": ["11"]})
    try:
        async with notices_on(store, jobs, FAST) as n:
            disk.full = True
            n.settled(decision("gpu01", Action.DRAIN), Status.CONFIRMED, "read back")
            await wait_until(lambda: store.write_failures >= 3, what="retries on a full disk")
            assert jobs.signals == [] and n.current("gpu01") is None
            disk.full = False
            await wait_until(lambda: jobs.signals == ["11"], timeout=30, what="the signal")
            await wait_until(lambda: jobs.requeues == ["11"], timeout=30, what="the requeue")
        assert jobs.signals == ["11"]
    finally:
        store.close()


async def test_a_resume_before_the_deadline_requeues_nothing(tmp_path: Path) -> None:
    store = DecisionStore(tmp_path / "o.db")
    jobs = ScriptedJobs({"gpu01": ["11"]})
    try:
        async with notices_on(store, jobs, NoticeSettings(checkpoint_grace_s=3600.0)) as n:
            n.settled(decision("gpu01", Action.DRAIN), Status.CONFIRMED, "read back")
            await wait_until(lambda: jobs.signals == ["11"])
            n.settled(decision("gpu01", Action.RESUME, 2), Status.CONFIRMED, "read back")
            await wait_until(lambda: n.current("gpu01") is None)
            (notice,) = n.all()
        assert notice.closed == "resumed before the deadline" and jobs.requeues == []
    finally:
        store.close()


async def test_an_exclusion_brings_the_deadline_forward_and_tells_no_one_twice(
    tmp_path: Path,
) -> None:
    store = DecisionStore(tmp_path / "o.db")
    jobs = ScriptedJobs({"gpu01": ["11"]})
    settings = NoticeSettings(checkpoint_grace_s=3600.0, critical_grace_s=0.1)
    try:
        async with notices_on(store, jobs, settings) as n:
            n.settled(decision("gpu01", Action.DRAIN), Status.CONFIRMED, "read back")
            await wait_until(lambda: jobs.signals == ["11"])
            n.settled(decision("gpu01", Action.EXCLUDE, 2), Status.CONFIRMED, "already drained")
            await wait_until(lambda: jobs.requeues == ["11"], what="requeue after the grace")
        assert jobs.signals == ["11"] and len(n.all()) == 1
    finally:
        store.close()


async def test_an_unreachable_scheduler_delays_the_notice_and_a_refusal_is_recorded(
    tmp_path: Path,
) -> None:
    store = DecisionStore(tmp_path / "o.db")
    jobs = ScriptedJobs({"gpu01": ["11"]})
    jobs.down = True
    jobs.no_requeue = {"11"}
    try:
        async with notices_on(store, jobs, FAST) as n:
            n.settled(decision("gpu01", Action.DRAIN), Status.CONFIRMED, "read back")
            await wait_until(lambda: (c := n.current("gpu01")) is not None and c.failures >= 2)
            assert jobs.signals == []
            jobs.down = False
            await wait_until(lambda: n.current("gpu01") is None, timeout=30)
            (notice,) = n.all()
        assert jobs.signals == ["11"] and jobs.requeues == []
        assert notice.jobs["11"].requeued.startswith("refused: Requested operation")
    finally:
        store.close()


def test_skipped_and_failed_deliveries_open_no_notice(tmp_path: Path) -> None:
    store = DecisionStore(tmp_path / "o.db")
    try:
        n = JobNotices(store, ScriptedJobs({}), FAST)
        n.settled(decision("gpu01", Action.DRAIN), Status.SKIPPED, "left alone")
        n.settled(decision("gpu01", Action.DRAIN), Status.FAILED, "refused")
        assert n._inbox == []
    finally:
        store.close()


async def test_a_disk_stalled_at_start_delays_the_notices_and_never_ends_the_task(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = DecisionStore(tmp_path / "o.db")
    disk = FlakyDisk(store._db)
    store._db = disk  # type: ignore[assignment]
    waits: list[float] = []

    async def quick(delay: float, wake: asyncio.Event) -> None:
        waits.append(delay)
        disk.stall.set()  # the disk thaws during the wait
        await asyncio.sleep(0)

    disk.stall.clear()  # reads wait, as on a frozen filesystem
    n = JobNotices(store, ScriptedJobs({}), FAST, sleep=quick)
    task = asyncio.create_task(n.run())
    try:
        await wait_until(n.loaded.is_set, timeout=30, what="notices loaded")
        assert not task.done() and waits[0] == 5.0
        assert "cannot read the open notices, retrying" in caplog.text
    finally:
        disk.stall.set()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        store.close()


async def test_a_signal_the_scheduler_could_not_take_is_sent_on_the_retry(tmp_path: Path) -> None:
    store = DecisionStore(tmp_path / "o.db")
    jobs = ScriptedJobs({"gpu01": ["11", "12"]})
    jobs.notify_failures = 2  # both jobs' first signals fail; each is asked again on its own
    try:
        async with notices_on(store, jobs, NoticeSettings(checkpoint_grace_s=3600.0)) as n:
            n.settled(decision("gpu01", Action.DRAIN), Status.CONFIRMED, "read back")

            def all_told() -> bool:
                c = n.current("gpu01")
                return c is not None and [j.signaled for j in c.jobs.values()] == ["done"] * 2

            await wait_until(all_told)
            notice = n.current("gpu01")
        assert jobs.signals == ["11", "12"]  # none forgotten, none twice
        assert notice is not None and [j.signaled for j in notice.jobs.values()] == ["done"] * 2
        assert n.counts.retries == {"unreachable": 2}
    finally:
        store.close()


class StrayCancelOnce(ScriptedJobs):
    """The first signal ends in a client library's CancelledError, no one cancelling."""

    strayed = False

    async def notify(self, job: RunningJob, terms: NoticeTerms) -> tuple[Outcome, str]:
        if not self.strayed:
            self.strayed = True
            raise CancelledWithResult()
        return await super().notify(job, terms)


async def test_a_notice_task_restarted_after_a_stray_cancellation_tells_no_job_twice(
    tmp_path: Path,
) -> None:
    store = DecisionStore(tmp_path / "o.db")
    jobs = StrayCancelOnce({"gpu01": ["11", "12"]})
    n = JobNotices(store, jobs, NoticeSettings(checkpoint_grace_s=3600.0))
    tasks = [  # as the daemon runs it (daemon/loops.py)
        asyncio.create_task(keep_running("job-notices", n.run, restart_s=0.05)),
        asyncio.create_task(store.run()),
    ]
    try:
        await n.loaded.wait()
        n.settled(decision("gpu01", Action.DRAIN), Status.CONFIRMED, "read back")
        await wait_until(lambda: jobs.signals == ["12"], what="the other job told")
        # Restarted, it reads its notices as after a crash: job 11's signal may have
        # gone out, so it is in flight, never sent again.
        notice = n.current("gpu01")
        assert notice is not None and notice.jobs["11"].signaled == IN_FLIGHT
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        store.close()
    assert jobs.signals == ["12"]
