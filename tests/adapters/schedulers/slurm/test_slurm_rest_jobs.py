"""Job notices through slurmrestd (Slurm >= 23.02) against the fake slurmrestd, over HTTP.

The fake follows Slurm 24.11's OpenAPI document (v0.0.42) for the job list and
the signal; the requeue goes through ``scontrol requeue`` (v0.0.42 has no REST
requeue), here the fake's ``fakes/scontrol.py`` run as a command. The 22.05
command path is tested against a real slurmctld in test_slurm_jobs.py.
"""

from __future__ import annotations

import contextlib
import sqlite3
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from adapters.schedulers.jobs import JobControlError, NoticeTerms, Outcome, RunningJob
from adapters.schedulers.slurm.auth import JwtToken
from adapters.schedulers.slurm.client import SlurmClient
from adapters.schedulers.slurm.hostlist import HostlistError, hostlist_has
from adapters.schedulers.slurm.job_list import convert, running_on
from adapters.schedulers.slurm.jobs import NOT_HERE, SignalScope, SlurmJobs
from adapters.schedulers.slurm.rest_jobs import SlurmRestJobs
from adapters.schedulers.slurm.sink import SlurmSink
from adapters.schedulers.slurm.versions import api_info
from daemon.config.scheduler import SlurmSchedulerConfig
from daemon.delivery.notices import JobNotices, NoticeSettings
from daemon.delivery.outbox import DecisionStore, Status
from daemon.delivery.sinks import build_backend, build_job_notices
from fakes.slurmrestd import FakeSlurmrestd, compress_hostlist
from policies.model import Action
from tests.support.delivery import decision, notices_on
from tests.support.paths import ROOT, SHARED_DATA
from tests.support.secrets import write_secret
from tests.support.wait import wait_until

FAST = NoticeSettings(
    checkpoint_grace_s=0.3, critical_grace_s=0.1, retry_initial_s=0.02, retry_max_s=0.05
)


def rest_jobs(
    fake: FakeSlurmrestd, token: Path, scope: SignalScope = "full", **kw: Any
) -> tuple[SlurmSink, SlurmRestJobs]:
    scontrol = (sys.executable, str(ROOT / "fakes" / "scontrol.py"), fake.url)
    client = SlurmClient(fake.url, token=JwtToken(token), timeout_s=2.0, scontrol=scontrol, **kw)
    commands = SlurmJobs(client, squeue=("/nonexistent/squeue",), scope=scope)
    return SlurmSink(client), SlurmRestJobs(client, commands, scope=scope)


@contextlib.asynccontextmanager
async def notices(
    tmp_path: Path, jobs: SlurmRestJobs, settings: NoticeSettings = FAST
) -> AsyncIterator[JobNotices]:
    store = DecisionStore(tmp_path / "o.db")
    try:
        async with notices_on(store, jobs, settings) as n:
            yield n
    finally:
        store.close()


def terms(signal: str) -> NoticeTerms:
    return NoticeTerms(signal, 0.0, "rackguard[gpu]: test", "gpu")


def closed(n: JobNotices, node: str) -> bool:
    """A notice of ``node`` opened and closed (settled() only queues the decision)."""
    return any(x.node == node and not x.open for x in n.all())


def signals(fake: FakeSlurmrestd) -> dict[int, list[tuple[str, str]]]:
    return {j.job_id: j.signals for j in fake.jobs.values() if j.signals}


async def test_jobs_are_listed_signalled_once_and_requeued_after_the_grace_through_rest(
    fake: FakeSlurmrestd, slurm_token: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    alone = fake.add_job("gpu01")
    wide = fake.add_job("gpu01", "gpu02", name="wide")
    pinned = fake.add_job("gpu01", requeue=False, name="pinned", user="bob")
    elsewhere = fake.add_job("gpu02")
    fake.jobs[fake.add_job("gpu01")].state = "PENDING"  # not running: not told
    sink, jobs = rest_jobs(fake, slurm_token)
    slow = NoticeSettings(checkpoint_grace_s=3600.0, critical_grace_s=0.2, retry_initial_s=0.02)
    try:
        async with notices(tmp_path, jobs, slow) as n:
            n.settled(decision("gpu01", Action.DRAIN), Status.CONFIRMED, "read back")
            await wait_until(lambda: (c := n.current("gpu01")) is not None and c.told_at)
            told = signals(fake)
            # The same drain confirmed again (a repair), then an exclusion: no second signal.
            n.settled(decision("gpu01", Action.DRAIN), Status.CONFIRMED, "read back")
            n.settled(decision("gpu01", Action.EXCLUDE, 2), Status.CONFIRMED, "read back")
            await wait_until(lambda: closed(n, "gpu01"), what="requeued at the deadline")
            (notice,) = n.all()
    finally:
        await sink.close()
    assert told == {j: [("USR1", "FULL_JOB")] for j in (alone, wide, pinned)}
    assert signals(fake) == told and elsewhere not in told
    assert ("GET", "/slurm/v0.0.42/jobs/") in fake.requests
    assert ("DELETE", f"/slurm/v0.0.42/job/{alone}") in fake.requests
    assert [(fake.jobs[j].state, fake.jobs[j].restarts) for j in (alone, wide)] == [
        ("PENDING", 1),
        ("PENDING", 1),
    ]
    assert fake.jobs[pinned].state == "RUNNING" and fake.jobs[elsewhere].state == "RUNNING"
    by_id = {j.job_id: j for j in notice.jobs.values()}
    assert by_id[str(alone)].requeued == "done" and by_id[str(alone)].signaled == "done"
    assert by_id[str(pinned)].requeued.startswith("refused: Requested operation is presently")
    assert f"job {pinned} (bob) cannot be requeued, left running" in caplog.text
    assert n.counts.signals == {"done": 3} and n.counts.requeues == {"done": 2, "refused": 1}
    assert n.counts.opened == {"drain": 1}


async def test_a_new_drain_after_a_resume_tells_the_jobs_again(
    fake: FakeSlurmrestd, slurm_token: Path, tmp_path: Path
) -> None:
    job = fake.add_job("gpu01")
    sink, jobs = rest_jobs(fake, slurm_token)
    slow = NoticeSettings(checkpoint_grace_s=3600.0)
    try:
        async with notices(tmp_path, jobs, slow) as n:
            n.settled(decision("gpu01", Action.DRAIN), Status.CONFIRMED, "read back")
            await wait_until(lambda: len(fake.jobs[job].signals) == 1)
            n.settled(decision("gpu01", Action.RESUME, 2), Status.CONFIRMED, "read back")
            await wait_until(lambda: closed(n, "gpu01"))
            n.settled(decision("gpu01", Action.DRAIN, 3), Status.CONFIRMED, "read back")
            await wait_until(lambda: (c := n.current("gpu01")) is not None and c.told_at)
    finally:
        await sink.close()
    assert fake.jobs[job].signals == [("USR1", "FULL_JOB")] * 2  # once per decision
    assert fake.jobs[job].state == "RUNNING"  # resumed before the deadline: not requeued


async def test_slurmrestd_down_delays_the_notice_and_never_drops_it(
    fake: FakeSlurmrestd, slurm_token: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO")
    job = fake.add_job("gpu01")
    sink, jobs = rest_jobs(fake, slurm_token)
    try:
        async with notices(tmp_path, jobs) as n:
            await fake.stop()
            n.settled(decision("gpu01", Action.EXCLUDE), Status.CONFIRMED, "read back")
            await wait_until(lambda: n.counts.retries["unreachable"] >= 3, what="retries")
            assert n.current("gpu01") is not None and not fake.jobs[job].signals
            await fake.start()
            await wait_until(lambda: closed(n, "gpu01"), what="told and requeued")
            # 5xx from a live slurmrestd: retried the same way.
            other = fake.add_job("gpu02")
            fake.fail_next, fake.fail_status = 4, 503
            n.settled(decision("gpu02", Action.EXCLUDE), Status.CONFIRMED, "read back")
            await wait_until(lambda: closed(n, "gpu02"), what="through the 503s")
    finally:
        await sink.close()
    assert fake.jobs[job].signals == [("USR1", "FULL_JOB")] and fake.jobs[job].restarts == 1
    assert fake.jobs[other].signals == [("USR1", "FULL_JOB")] and fake.jobs[other].restarts == 1
    assert "reachable again" in caplog.text


async def test_a_refused_token_is_reported_retried_and_the_notice_goes_on_once_fixed(
    fake: FakeSlurmrestd, slurm_token: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    job = fake.add_job("gpu01")
    write_secret(slurm_token, "token-rotated-away\n")
    sink, jobs = rest_jobs(fake, slurm_token)
    try:
        async with notices(tmp_path, jobs) as n:
            n.settled(decision("gpu01", Action.DRAIN), Status.CONFIRMED, "read back")
            await wait_until(lambda: n.counts.retries["auth"] >= 2, what="auth retries")
            assert "refused even after a refresh" in caplog.text
            assert any(r.levelname == "ERROR" for r in caplog.records)
            assert not fake.jobs[job].signals
            write_secret(slurm_token, "token-root\n")  # the operator rotates it back
            await wait_until(lambda: fake.jobs[job].signals, what="the signal once fixed")
    finally:
        await sink.close()
    assert fake.jobs[job].signals == [("USR1", "FULL_JOB")]


async def test_signal_answers_become_outcomes(fake: FakeSlurmrestd, slurm_token: Path) -> None:
    done = fake.add_job("gpu01")
    finished = fake.add_job("gpu01")
    fake.jobs[finished].state = "COMPLETED"
    sink, jobs = rest_jobs(fake, slurm_token, scope="batch")
    here = {"node": "gpu01"}
    try:
        assert await jobs.notify(RunningJob(str(done), **here), terms("USR1")) == (
            Outcome.DONE,
            "ok",
        )
        gone, said = await jobs.notify(RunningJob("999999", **here), terms("USR1"))
        assert gone is Outcome.GONE and said == NOT_HERE
        finished_job = RunningJob(str(finished), **here)
        assert (await jobs.notify(finished_job, terms("USR1")))[0] is Outcome.GONE
        elsewhere, said = await jobs.notify(RunningJob(str(done), node="gpu02"), terms("USR1"))
        assert elsewhere is Outcome.GONE and said == NOT_HERE
        # A signal name slurmrestd does not parse: 24.11 answers 200 with error 0 (and
        # kills the job): sending it again cannot help, and it is no notice.
        refused, said = await jobs.notify(RunningJob(str(done), **here), terms("WINCH"))
        assert refused is Outcome.REFUSED and "Unknown signal" in said
    finally:
        await sink.close()
    assert fake.jobs[done].signals == [("USR1", "BATCH_JOB"), ("KILL", "BATCH_JOB")]


async def test_a_user_who_may_not_signal_is_an_operators_problem(
    fake: FakeSlurmrestd, tmp_path: Path
) -> None:
    fake.tokens["nobody"] = "token-nobody"
    job = fake.add_job("gpu01", user="alice")
    token = tmp_path / "jwt"
    write_secret(token, "token-nobody\n")
    sink, jobs = rest_jobs(fake, token, user="nobody")
    try:
        with pytest.raises(JobControlError, match="2002") as err:
            await jobs.notify(RunningJob(str(job), node="gpu01"), terms("USR1"))
    finally:
        await sink.close()
    assert err.value.permanent and err.value.reason == "auth" and not fake.jobs[job].signals


async def test_hostile_jobs_a_malformed_job_list_is_refused_whole(
    fake: FakeSlurmrestd, slurm_token: Path
) -> None:
    # A job that cannot be placed might be on this node: nothing is concluded from the rest.
    sink, jobs = rest_jobs(fake, slurm_token)
    good = {"job_id": 7, "job_state": ["RUNNING"], "nodes": "gpu[01-02]", "user_name": "al"}
    garbage: list[Any] = [
        "x",
        None,
        {"job_id": "7; rm -rf", "job_state": ["RUNNING"], "nodes": "gpu01"},
        {"job_id": 9, "job_state": ["RUNNING"], "nodes": "gpu[01"},
        {"job_state": ["RUNNING"], "nodes": "gpu01"},
        {"job_id": {"set": False, "number": 8}, "job_state": ["RUNNING"], "nodes": "gpu01"},
    ]
    try:
        await sink.read_state(["gpu01"])  # the API version first
        refusals = []
        for bad in garbage:
            fake.fail_next, fake.fail_status, fake.fail_body = 1, 200, {"jobs": [bad, good]}
            with pytest.raises(JobControlError) as err:
                await jobs.running("gpu01")
            refusals.append(err.value.reason)
        fake.fail_next, fake.fail_body = 1, {"jobs": "not a list"}
        with pytest.raises(JobControlError, match="not a Slurm job list"):
            await jobs.running("gpu01")
        ten = {"job_id": 10, "job_state": "RUNNING", "nodes": "gpu01"}  # v0.0.38's string form
        idle = {"job_id": 11, "job_state": None, "nodes": "gpu01"}
        fake.fail_next, fake.fail_body = 1, {"jobs": [ten, idle, good]}
        listed = await jobs.running("gpu01")
        fake.fail_next, fake.fail_status, fake.fail_body = 1, 500, {"errors": "oops"}
        with pytest.raises(JobControlError, match="HTTP 500") as transient:
            await jobs.running("gpu01")
        fake.fail_next, fake.fail_status, fake.fail_body = 1, 403, None
        with pytest.raises(JobControlError, match="HTTP 403") as forbidden:
            await jobs.running("gpu01")
    finally:
        await sink.close()
    assert refusals == ["malformed"] * len(garbage)
    assert not transient.value.permanent
    assert forbidden.value.permanent and forbidden.value.reason == "auth"
    assert [j.job_id for j in listed] == ["10", "7"]
    assert listed[1] == RunningJob("7", "", "al", node="gpu01", label="7", target="7")


async def test_slurm_22_05_keeps_the_commands(slurm_token: Path) -> None:
    old = FakeSlurmrestd(versions=("v0.0.36", "v0.0.37", "v0.0.38"))
    await old.start()
    sink, jobs = rest_jobs(old, slurm_token)
    try:
        with pytest.raises(JobControlError, match="cannot run '/nonexistent/squeue'"):
            await jobs.running("gpu01")
    finally:
        await sink.close()
        await old.stop()
    assert not any(path.endswith("/jobs/") for _, path in old.requests)


def test_the_recorded_22_05_paths_offer_no_rest_job_control() -> None:
    recorded = SHARED_DATA / "slurm" / "openapi-22.05-paths.txt"
    if not recorded.is_file():
        pytest.skip(f"real Slurm data not found at {recorded} (../shared/data is absent)")
    paths: dict[str, dict[str, Any]] = {}
    for line in recorded.read_text().splitlines():
        method, _, path = line.partition(" ")
        paths.setdefault(path, {})[method.lower()] = {}
    info = api_info({"paths": paths})
    # 22.05 serves GET jobs and DELETE job/{job_id}, but only from v0.0.39 on are they used.
    assert info.versions[-1] == "v0.0.38" and info.job_control == ()
    assert not info.can_signal("v0.0.38")


async def test_the_fake_offers_rest_job_control_from_v0_0_39(slurm_token: Path) -> None:
    fake = FakeSlurmrestd(versions=("v0.0.38", "v0.0.39", "v0.0.42"))
    await fake.start()
    sink = SlurmSink(SlurmClient(fake.url, token=JwtToken(slurm_token), api_version="v0.0.39"))
    try:
        assert await sink.client.job_api() == "v0.0.39"
    finally:
        await sink.close()
        await fake.stop()
    assert sink.client.info is not None and sink.client.info.job_control == ("v0.0.39", "v0.0.42")


@pytest.mark.parametrize(
    ("expr", "node", "member"),
    [
        ("gpu01", "gpu01", True),
        ("gpu[01-03,07]", "gpu02", True),
        ("gpu[01-03,07]", "gpu07", True),
        ("gpu[01-03,07]", "gpu04", False),
        ("gpu[01-03,07]", "gpu2", False),  # the padding is part of the name
        ("gpu[8-10]", "gpu10", True),
        ("gpu[08-10]", "gpu09", True),
        ("gpu[1-3]", "gpu01", False),
        ("login1,gpu[01-02]", "login1", True),
        ("rack[1-2]-gpu[01-02]", "rack2-gpu01", True),
        ("rack[1-2]-gpu[01-02]", "rack3-gpu01", False),
        ("gpu[0001-9999]", "gpu5000", True),
        ("", "gpu01", False),
        ("gpu01x", "gpu01", False),
    ],
)
def test_hostlist_membership(expr: str, node: str, member: bool) -> None:
    assert hostlist_has(expr, node) is member


@pytest.mark.parametrize("expr", ["gpu[01", "gpu01]", "gpu[a-b]", "gpu[1-]x]"])
def test_a_malformed_hostlist_is_an_error(expr: str) -> None:
    with pytest.raises(HostlistError):
        hostlist_has(expr, "gpu01")


def test_the_fakes_hostlists_read_back() -> None:
    names = ["gpu01", "gpu02", "gpu04", "login1"]
    expr = compress_hostlist(names)
    assert expr == "gpu[01-02,04],login1"
    assert [n for n in ["gpu01", "gpu02", "gpu03", "gpu04", "login1"] if hostlist_has(expr, n)] == [
        "gpu01",
        "gpu02",
        "gpu04",
        "login1",
    ]
    listing = convert({"jobs": [{"job_id": 3, "job_state": ["RUNNING"], "nodes": expr}]})
    assert running_on(listing, "gpu04")


async def test_the_daemon_takes_the_rest_path_with_a_rest_url(slurm_token: Path) -> None:
    rest = SlurmSchedulerConfig(
        type="slurm", rest_url="http://127.0.0.1:6820", token_file=slurm_token
    )
    backend = build_backend(rest, 600.0)
    built = build_job_notices(rest, 600.0, backend)
    commands = SlurmSchedulerConfig(type="slurm")
    plain = build_job_notices(commands, 600.0, build_backend(commands, 600.0))
    await backend.sink().close()
    assert built is not None and isinstance(built[0], SlurmRestJobs)
    assert plain is not None and isinstance(plain[0], SlurmJobs)


async def test_a_restart_between_the_signal_and_the_requeue_neither_repeats_nor_forgets(
    fake: FakeSlurmrestd, slurm_token: Path, tmp_path: Path
) -> None:
    job = fake.add_job("gpu01")
    sink, jobs = rest_jobs(fake, slurm_token)
    slow = NoticeSettings(checkpoint_grace_s=3600.0, retry_initial_s=0.02, retry_max_s=0.05)
    try:
        async with notices(tmp_path, jobs, slow) as n:
            n.settled(decision("gpu01", Action.DRAIN), Status.CONFIRMED, "read back")
            await wait_until(lambda: (c := n.current("gpu01")) is not None and c.told_at)
        # The next process finds the notice in the database, its deadline now due.
        db = sqlite3.connect(tmp_path / "o.db")
        db.execute("UPDATE notices SET deadline = 0")
        db.commit()
        db.close()
        async with notices(tmp_path, jobs, slow) as n:
            await wait_until(lambda: closed(n, "gpu01"), what="requeued after the restart")
    finally:
        await sink.close()
    assert fake.jobs[job].signals == [("USR1", "FULL_JOB")]
    assert (fake.jobs[job].state, fake.jobs[job].restarts) == ("PENDING", 1)


async def test_a_federation_job_id_is_signalled_through_the_job_list_path(
    fake: FakeSlurmrestd, slurm_token: Path
) -> None:
    # A federation member's ids carry the cluster in their top bits: above MAX_JOB_ID,
    # which slurmrestd's DELETE job/{job_id} rejects before asking slurmctld.
    big = fake.add_job("gpu01", job_id=(3 << 26) + 41)
    sink, jobs = rest_jobs(fake, slurm_token)
    try:
        (listed,) = await jobs.running("gpu01")
        assert await jobs.notify(listed, terms("USR1")) == (Outcome.DONE, "ok")
        stranger = RunningJob(str((3 << 26) + 42), node="gpu01")
        gone, _ = await jobs.notify(stranger, terms("USR1"))
        status, _ = await sink.client.call(
            "DELETE", f"/slurm/v0.0.42/job/{big}", {"signal": "USR1"}
        )
    finally:
        await sink.close()
    assert listed.job_id == str(big) and gone is Outcome.GONE
    assert fake.jobs[big].signals == [("USR1", "FULL_JOB")]
    assert ("DELETE", "/slurm/v0.0.42/jobs/") in fake.requests
    assert status == 404  # the singular path would have refused it (24.11: 404, 2017)
