"""Against a real Slurm 24.11 (Debian 13, in a chroot): slurmctld, four slurmd, slurmrestd (JWT).

The REST paths rackguard takes on 23.02 and newer, at each data-parser version
24.11 serves (v0.0.40-v0.0.42): version discovery, node reads, drain / exclude /
resume through the outbox with read-back, an administrator's drain left alone,
the running jobs of a node (plain, heterogeneous, array) signalled and requeued,
and a token that expires renewed. The cluster is built (once, cached) and started
by scripts/start-slurm24.sh, on free ports, and stopped at the end.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from adapters.schedulers.jobs import JobControlError, NoticeTerms, Outcome, RunningJob
from adapters.schedulers.slurm.auth import JwtToken
from adapters.schedulers.slurm.client import SlurmClient
from adapters.schedulers.slurm.jobs import NOT_HERE, SlurmJobs
from adapters.schedulers.slurm.rest_jobs import SlurmRestJobs
from adapters.schedulers.slurm.sink import SlurmSink
from daemon.delivery.outbox import Status
from fakes.slurmrestd import FakeSlurmrestd
from policies.model import Action
from tests.support.delivery import StoreAndDeliverer as Outbox
from tests.support.secrets import write_secret
from tests.support.slurm import NODES, decision, deliver_all
from tests.support.slurm24 import VERSIONS, Slurm24, assert_listed
from tests.support.slurm24_exchanges import (
    EXCHANGES,
    answer_problems,
    comparable,
    play,
    record,
    recording,
)
from tests.support.wait import wait_until

pytestmark = pytest.mark.slurm

USR1 = NoticeTerms("USR1", 0.0, "rackguard: test", "gpu")


@pytest.fixture(params=VERSIONS)
async def sink(request: pytest.FixtureRequest, slurm24: Slurm24) -> AsyncIterator[SlurmSink]:
    c = slurm24.cluster
    client = SlurmClient(
        c.rest_url,
        token=JwtToken(c.token_file),
        api_version=request.param,
        scontrol=c.command("scontrol"),
        slurm_conf=c.conf,
        timeout_s=20.0,
    )
    s = SlurmSink(client, exclude_state="down")
    yield s
    await s.close()


@pytest.fixture
def outbox(tmp_path: Path, sink: SlurmSink) -> Iterator[Outbox]:
    box = Outbox(tmp_path / "outbox.sqlite3", sink, retry_initial_s=0.05, retry_max_s=0.2)
    yield box
    box.close()


def commands(slurm24: Slurm24, client: SlurmClient) -> SlurmJobs:
    """The commands inside the chroot, on ``client``'s scontrol, SLURM_CONF and timeout."""
    c = slurm24.cluster
    return SlurmJobs(client, squeue=c.command("squeue"), scancel=c.command("scancel"))


async def test_slurm24_version_is_discovered(slurm24: Slurm24) -> None:
    c = slurm24.cluster
    sink = SlurmSink(SlurmClient(c.rest_url, token=JwtToken(c.token_file), timeout_s=20.0))
    try:
        assert await sink.client.job_api() == "v0.0.42"
    finally:
        await sink.close()
    info = sink.client.info
    assert info is not None
    assert info.versions == VERSIONS
    assert info.node_write == VERSIONS and info.job_control == VERSIONS
    assert info.bulk_signal == VERSIONS


async def test_slurm24_nodes_list_and_one_node_read(sink: SlurmSink) -> None:
    listed = await sink.list_nodes()
    assert sorted(n.view.node for n in listed) == list(NODES)
    one = await sink.read_state(["gpu01"])
    assert one["gpu01"].exists and not one["gpu01"].held
    assert one["gpu01"].detail.startswith("IDLE")
    # 24.11 answers a one-node read of an unknown node 200 with error 0 "No error"
    # and no nodes: still "does not exist", never an error that stalls the outbox.
    assert (await sink.read_state(["gpu99"]))["gpu99"].exists is False
    views = await sink.read_state([*NODES, "gpu99"])
    assert [views[n].exists for n in NODES] == [True] * 4 and not views["gpu99"].exists


async def test_slurm24_drain_exclude_resume_through_the_outbox(
    slurm24: Slurm24, outbox: Outbox, sink: SlurmSink
) -> None:
    c = slurm24.cluster
    await deliver_all(outbox, decision("gpu01", Action.DRAIN))
    shown = c.show("gpu01")
    assert "State=IDLE+DRAIN" in shown and "Reason=rackguard[gpu]: real slurm drain #1" in shown
    await deliver_all(outbox, decision("gpu01", Action.EXCLUDE, 2))
    assert "State=DOWN" in c.show("gpu01")
    await deliver_all(outbox, decision("gpu01", Action.RESUME, 3))
    shown = c.show("gpu01")
    assert "DRAIN" not in shown.split("Reason=")[0] and "DOWN" not in shown.split("Reason=")[0]
    assert [r.status for r in (await outbox.history())] == [Status.CONFIRMED] * 3
    assert outbox.confirmed == {"gpu01": Action.RESUME}
    view = (await sink.read_state(["gpu01"]))["gpu01"]
    assert not view.held


async def test_slurm24_an_administrators_drain_is_left_alone(
    slurm24: Slurm24, outbox: Outbox
) -> None:
    c = slurm24.cluster
    c.scontrol("update", "nodename=gpu02", "state=drain", "reason=maint ticket-1")
    await deliver_all(outbox, decision("gpu02", Action.EXCLUDE))
    await deliver_all(outbox, decision("gpu02", Action.RESUME, 2))
    shown = c.show("gpu02")
    assert "State=IDLE+DRAIN" in shown and "Reason=maint ticket-1" in shown
    assert [r.status for r in (await outbox.history())] == [Status.SKIPPED, Status.SKIPPED]


async def test_slurm24_jobs_listed_signalled_and_requeued(
    slurm24: Slurm24, sink: SlurmSink
) -> None:
    jobs = SlurmRestJobs(sink.client, commands(slurm24, sink.client))
    keep, stay = slurm24.keep_and_stay()
    await assert_listed(jobs, keep, stay)

    (kept,) = await jobs.running("gpu01")
    (stays,) = await jobs.running("gpu02")
    assert await _told(slurm24, jobs, kept) == (Outcome.DONE, "ok")
    await wait_until(lambda: slurm24.usr1(keep) == 1, timeout=10)
    assert slurm24.job_state(keep) == "RUNNING"  # told, not ended

    outcome, _ = await jobs.requeue(kept)
    assert outcome is Outcome.DONE
    assert slurm24.show_job(keep)["Restarts"] == "1"
    outcome, said = await jobs.requeue(stays)
    assert outcome is Outcome.REFUSED and "disabled" in said
    assert slurm24.job_state(stay) == "RUNNING"

    slurm24.cluster.run("scancel", stay)
    await wait_until(lambda: slurm24.job_state(stay) in ("", "COMPLETING", "CANCELLED"), timeout=10)
    await wait_until(lambda: slurm24.job_state(stay) == "", timeout=15)
    # Only v0.0.42 says per job what became of a signal (status[].error): v0.0.40 and
    # v0.0.41 answer 200 with no errors for a finished job and for an unknown one alike.
    # The job is asked for by id on its node before the signal, so neither is sent.
    outcome, said = await jobs.notify(stays, USR1)
    assert (outcome, said) == (Outcome.GONE, NOT_HERE)
    outcome, said = await jobs.notify(RunningJob("999999", "x", "root", node="gpu02"), USR1)
    assert (outcome, said) == (Outcome.GONE, NOT_HERE)


async def test_slurm24_heterogeneous_and_array_jobs(slurm24: Slurm24, sink: SlurmSink) -> None:
    jobs = SlurmRestJobs(sink.client, commands(slurm24, sink.client))
    het = slurm24.sbatch("-w", "gpu03", "-J", "het", ":", "-w", "gpu04")
    array = slurm24.sbatch("-w", "gpu01", "--array=0-1", "-J", "arr")
    # A het job's components are listed as jobs of their own (ids leader + offset), but
    # a signal to the component on gpu04 reaches nobody: the batch shell is the
    # leader's, on gpu03. Both nodes must name the leader.
    on3 = await _running(jobs, "gpu03")
    on4 = await _running(jobs, "gpu04")
    assert [(j.acted_on, j.name, j.user) for j in on3 + on4] == [(het, "het", "root")] * 2
    assert on3[0].job_id == het and on4[0].job_id != het  # each part, its own id
    # Array tasks are named ARRAY_TASK.
    on1 = await _running(jobs, "gpu01", count=2)
    assert [(j.acted_on, j.name) for j in on1] == [(f"{array}_0", "arr"), (f"{array}_1", "arr")]

    assert (await _told(slurm24, jobs, on4[0], het))[0] is Outcome.DONE
    await wait_until(lambda: slurm24.usr1(het) == 1, timeout=10)
    outcome, _ = await jobs.requeue(on4[0])
    assert outcome is Outcome.DONE and slurm24.show_job(het)["Restarts"] == "1"
    ids = slurm24.array_task_ids(array)  # each task's SLURM_JOB_ID
    for task, shell in zip(on1, ids, strict=True):
        assert (await _told(slurm24, jobs, task, shell))[0] is Outcome.DONE
    # Each task exactly once: by the array's own id, one task's signal would reach both.
    await wait_until(lambda: [slurm24.usr1(i) for i in ids] == [1, 1], timeout=10)
    assert slurm24.job_state(array) in ("RUNNING", "")


async def _told(
    slurm24: Slurm24, jobs: SlurmRestJobs, job: RunningJob, shell: str = ""
) -> tuple[Outcome, str]:
    """notify() once the batch shell traps USR1 (RUNNING comes before that: a signal then
    would end it), again while Slurm says the job is still launching (2020)."""
    await wait_until(lambda: slurm24.starts(shell or job.job_id), timeout=15)
    for _ in range(100):
        try:
            return await jobs.notify(job, USR1)
        except JobControlError as err:
            assert "2020" in str(err), err
            await asyncio.sleep(0.1)
    raise AssertionError(f"job {job.job_id} could not be signalled")


async def _running(jobs: SlurmRestJobs, node: str, count: int = 1) -> list[RunningJob]:
    """The jobs running on ``node`` once there are ``count`` of them."""
    found: list[RunningJob] = []
    for _ in range(300):
        found = sorted(await jobs.running(node), key=lambda j: j.acted_on)
        if len(found) >= count:
            return found
        await asyncio.sleep(0.1)
    raise AssertionError(f"{node}: {count} running jobs expected, found {found}")


async def test_slurm24_an_expired_token_is_renewed(slurm24: Slurm24, tmp_path: Path) -> None:
    c = slurm24.cluster
    stale = tmp_path / "jwt"
    write_secret(stale, slurm24.token(lifespan=1) + "\n")
    await asyncio.sleep(2.2)  # the token has expired
    refresh = [*c.prefix, "env", f"SLURM_CONF={c.conf}", "scontrol", "token", "lifespan=600"]
    # refresh_before_s=0: only the server's refusal makes it ask for a new one.
    token = JwtToken(stale, refresh_command=refresh, refresh_before_s=0)
    sink = SlurmSink(SlurmClient(c.rest_url, token=token, timeout_s=20.0))
    try:
        views = await sink.read_state(["gpu01"])
        assert views["gpu01"].exists and token.refreshes == 1
        # Before it expires (refresh_before_s beyond its life): renewed ahead, once.
        write_secret(stale, slurm24.token(lifespan=30) + "\n")
        early = JwtToken(stale, refresh_command=refresh, refresh_before_s=60)
        ahead = SlurmSink(SlurmClient(c.rest_url, token=early, timeout_s=20.0))
        try:
            assert (await ahead.read_state(["gpu02"]))["gpu02"].exists
            assert (await ahead.read_state(["gpu03"]))["gpu03"].exists
        finally:
            await ahead.close()
        assert early.refreshes == 1
    finally:
        await sink.close()


@pytest.mark.parametrize("version", VERSIONS)
async def test_slurm24_answers_are_the_recorded_ones(slurm24: Slurm24, version: str) -> None:
    """The real server still answers every exchange as recorded in tests/fixtures/slurm24
    (which the fake is held to, test_slurm24_fake.py); RACKGUARD_RECORD=1 records anew."""
    tokens = {"root": slurm24.token(), "nobody": slurm24.token("nobody")}
    answers = await play(slurm24.cluster.rest_url, tokens, version)
    if os.environ.get("RACKGUARD_RECORD") == "1":
        release = slurm24.cluster.scontrol("-V").stdout.split()[-1]
        record(version, answers, release)
    recorded = recording(version)
    assert list(answers) == list(recorded)
    steady = {e.name for e in EXCHANGES if e.steady}
    for name, answer in answers.items():
        if name in steady:
            assert comparable(answer) == comparable(recorded[name]), name
        assert answer_problems(recorded[name], answer) == [], name
    # The same exchanges against the fake, side by side with the live server.
    fake = FakeSlurmrestd(tokens={"root": "token-root", "nobody": "token-nobody"})
    await fake.start()
    try:
        faked = await play(fake.url, fake.tokens, version)
    finally:
        await fake.stop()
    problems = {n: p for n, a in faked.items() if (p := answer_problems(answers[n], a))}
    assert problems == {}
