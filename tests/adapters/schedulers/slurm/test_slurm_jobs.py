"""Job notices against a real Slurm 22.05 running real batch jobs.

Each job script traps USR1 and writes a checkpoint marker; a drain (or an
exclusion, carried out as a drain) applied by the deliverer opens a notice:
the jobs are signalled once, and requeued after the grace, never killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from adapters.schedulers.slurm.client import SlurmClient
from adapters.schedulers.slurm.jobs import SlurmJobs
from adapters.schedulers.slurm.sink import SlurmSink
from adapters.sensors.nvml import NvmlAdapter
from daemon.app import Daemon
from daemon.config import parse_config
from daemon.delivery.notices import JobNotices, NoticeSettings
from fakes.nvml import fake_node
from policies.model import Action
from tests.support.delivery import StoreAndDeliverer, decision
from tests.support.paths import ROOT
from tests.support.slurm import Cluster
from tests.support.wait import wait_for_result, wait_until

pytestmark = pytest.mark.slurm

JOB = """#!/bin/bash
trap 'echo "usr1 restart=${SLURM_RESTART_COUNT:-0}" >> {marker}' USR1
echo "start restart=${SLURM_RESTART_COUNT:-0}" >> {marker}
while true; do sleep 0.2; done
"""


class Jobs:
    """Batch jobs submitted by one test, each with its marker file; cancelled at the end."""

    def __init__(self, cluster: Cluster, where: Path) -> None:
        self.cluster = cluster
        self.where = where
        self.ids: list[str] = []

    def submit(
        self,
        node: str,
        *,
        requeue: bool = True,
        name: str = "",
        uid: str = "",
        extra: tuple[str, ...] = (),
    ) -> str:
        """A batch job on ``node`` (``extra``: more sbatch options, a hetjob's ``: -w N``)."""
        n = len(self.ids)
        marker = self.where / f"marker.{n}"
        script = self.where / f"job{n}.sh"
        script.write_text(JOB.replace("{marker}", str(marker)))
        script.chmod(0o755)
        flag = "--requeue" if requeue else "--no-requeue"
        who = [f"--uid={uid}"] if uid else []
        named = [f"--job-name={name}"] if name else []
        argv = ["sbatch", "--parsable", *who, *named, "-w", node, flag, "-o", "/dev/null"]
        out = subprocess.run(
            [*argv, *extra, str(script)],
            env=self.cluster.env,
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout.strip()
        self.ids.append(out.split(";")[0])
        return self.ids[-1]

    def marker(self, job: str) -> list[str]:
        path = self.where / f"marker.{self.ids.index(job)}"
        return path.read_text().splitlines() if path.exists() else []

    def field(self, job: str, key: str) -> str:
        line = self.cluster.scontrol("-o", "show", "job", job).stdout
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        return fields.get(key, "")

    def cancel(self) -> None:
        if self.ids:
            subprocess.run(["scancel", *self.ids], env=self.cluster.env, check=False, timeout=30)


@pytest.fixture
def jobs(clean: Cluster, tmp_path: Path) -> Iterator[Jobs]:
    # Under /tmp, world-writable: a job submitted as another user writes its marker there.
    where = Path(tempfile.mkdtemp(prefix="rg-jobs-", dir="/tmp"))
    where.chmod(0o777)
    j = Jobs(clean, where)
    yield j
    j.cancel()
    shutil.rmtree(where, ignore_errors=True)


class Rig:
    """Store, deliverer and job notices on one database, wired as the daemon wires them."""

    def __init__(self, path: Path, cluster: Cluster, settings: NoticeSettings) -> None:
        self.sink = SlurmSink(
            SlurmClient(None, slurm_conf=cluster.conf, timeout_s=20), exclude_state="drain"
        )
        self.box = StoreAndDeliverer(path, self.sink, retry_initial_s=0.05, retry_max_s=0.5)
        self.notices = JobNotices(
            self.box.store,
            SlurmJobs(self.sink.client),
            settings,
        )
        self.box.on_settled = self.notices.settled


@contextlib.asynccontextmanager
async def running(tmp_path: Path, cluster: Cluster, settings: NoticeSettings) -> AsyncIterator[Rig]:
    rig = Rig(tmp_path / "outbox.sqlite3", cluster, settings)
    tasks = [asyncio.create_task(t) for t in (rig.box.run(), rig.notices.run())]
    try:
        yield rig
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        rig.box.close()


async def running_job(jobs: Jobs, node: str, *, requeue: bool = True, **kw: Any) -> str:
    job = jobs.submit(node, requeue=requeue, **kw)
    await wait_until(lambda: jobs.marker(job), timeout=60, what=f"job {job} started")
    return job


def usr1(jobs: Jobs, job: str) -> list[str]:
    return [line for line in jobs.marker(job) if line.startswith("usr1")]


async def test_a_drain_signals_the_job_then_requeues_it_and_it_runs_again_after_resume(
    jobs: Jobs, clean: Cluster, tmp_path: Path
) -> None:
    job = await running_job(jobs, "gpu01")
    settings = NoticeSettings(checkpoint_grace_s=3.0)
    async with running(tmp_path, clean, settings) as rig:
        rig.box.submit(decision("gpu01", Action.DRAIN))
        await wait_until(lambda: usr1(jobs, job), timeout=30, what="USR1 reached the batch shell")
        notice = rig.notices.current("gpu01")
        assert notice is not None and notice.action is Action.DRAIN
        assert notice.deadline == pytest.approx(notice.noticed_at + 3.0)
        assert notice.jobs[job].signaled == "done" and notice.jobs[job].signal == "USR1"
        # The job is still running on the drained node until the deadline.
        assert "DRAIN" in clean.show("gpu01")
        await wait_until(lambda: rig.notices.current("gpu01") is None, timeout=60, what="requeue")
        (closed,) = rig.notices.all()
        assert closed.closed == "requeued" and closed.jobs[job].requeued == "done"
        assert jobs.field(job, "Restarts") == "1"
        assert jobs.field(job, "JobState") in {"PENDING", "COMPLETING"}
        rig.box.submit(decision("gpu01", Action.RESUME, 2))
        await wait_until(lambda: not rig.box.pending(), timeout=60, what="resume delivered")
    # Slurm holds a requeued job back (BeginTime, about two minutes): release it now.
    await wait_until(lambda: jobs.field(job, "JobState") == "PENDING", timeout=60)
    clean.scontrol("update", f"jobid={job}", "starttime=now")
    await wait_until(
        lambda: "start restart=1" in jobs.marker(job), timeout=60, what="the job ran again"
    )
    assert usr1(jobs, job) == ["usr1 restart=0"]  # told once


async def test_a_job_that_cannot_be_requeued_is_left_running_and_logged(
    jobs: Jobs, clean: Cluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    job = await running_job(jobs, "gpu02", requeue=False)
    caplog.set_level(logging.WARNING, logger="daemon.delivery.notices")
    async with running(tmp_path, clean, NoticeSettings(checkpoint_grace_s=1.0)) as rig:
        rig.box.submit(decision("gpu02", Action.DRAIN))
        await wait_until(lambda: rig.notices.all() and not rig.notices.all()[0].open, timeout=60)
        (notice,) = rig.notices.all()
    assert notice.jobs[job].signaled == "done"
    assert notice.jobs[job].requeued.startswith("refused:")
    assert jobs.field(job, "JobState") == "RUNNING" and jobs.field(job, "Restarts") == "0"
    assert f"job {job} (root) cannot be requeued, left running" in caplog.text


async def test_an_exclusion_drains_tells_and_requeues_rather_than_kills(
    jobs: Jobs, clean: Cluster, tmp_path: Path
) -> None:
    job = await running_job(jobs, "gpu03")
    settings = NoticeSettings(checkpoint_grace_s=600.0, critical_grace_s=1.0)
    async with running(tmp_path, clean, settings) as rig:
        rig.box.submit(decision("gpu03", Action.EXCLUDE))
        await wait_until(lambda: usr1(jobs, job), timeout=30, what="USR1 after the exclusion")
        shown = clean.show("gpu03")
        assert "DRAIN" in shown and "DOWN" not in shown.split("Reason=")[0]
        await wait_until(lambda: rig.notices.current("gpu03") is None, timeout=60, what="requeue")
    assert jobs.field(job, "Restarts") == "1"
    assert jobs.field(job, "JobState") in {"PENDING", "COMPLETING"}


def ids_on(cluster: Cluster, node: str) -> list[str]:
    """The numeric ids of the jobs running on ``node`` (squeue's %A: no user-written field)."""
    out = subprocess.run(
        ["squeue", "-h", "-w", node, "-t", "RUNNING", "-o", "%A"],
        env=cluster.env,
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    return out.split()


async def test_hostile_jobs_a_job_name_never_reaches_another_users_jobs(
    jobs: Jobs, clean: Cluster, tmp_path: Path
) -> None:
    # The reported attack: a job on gpu02 whose name, read as squeue's '%i|%j|%u' lines,
    # named two jobs of another user on other nodes. Those were signalled and requeued.
    victim = await running_job(jobs, "gpu01", uid="nobody")
    other = await running_job(jobs, "gpu03", uid="nobody")
    attack = f"x|y\n{victim}|a|b\n{other}|c"
    attacker = await running_job(jobs, "gpu02", name=attack)
    async with running(tmp_path, clean, NoticeSettings(checkpoint_grace_s=2.0)) as rig:
        rig.box.submit(decision("gpu02", Action.DRAIN))
        await wait_until(lambda: usr1(jobs, attacker), timeout=30, what="the attacker told")
        await wait_until(
            lambda: rig.notices.all() and not rig.notices.all()[0].open, timeout=60, what="close"
        )
        (notice,) = rig.notices.all()
    assert set(notice.jobs) == {attacker} and notice.closed == "requeued"
    note = notice.jobs[attacker]
    assert (note.signaled, note.requeued) == ("done", "done")
    assert note.name == attack.replace("\n", "\\n") and note.user == "root"
    for job in (victim, other):
        assert not usr1(jobs, job), job
        assert (jobs.field(job, "JobState"), jobs.field(job, "Restarts")) == ("RUNNING", "0")
        assert jobs.field(job, "UserId").startswith("nobody")
    assert "DRAIN" not in clean.show("gpu01").split(" Reason=")[0]


async def test_hostile_jobs_odd_names_arrays_and_heterogeneous_parts_are_all_told(
    jobs: Jobs, clean: Cluster, tmp_path: Path
) -> None:
    # Hidden before: a name with a '|' (four fields) and a hetjob component ("5+1").
    ckpt = await running_job(jobs, "gpu04", name="ckpt|v2")
    await running_job(jobs, "gpu01", extra=("--array=0-1",))
    het = await running_job(jobs, "gpu03", extra=(":", "-w", "gpu02"))
    await wait_until(lambda: ids_on(clean, "gpu02"), timeout=30, what="the hetjob component")
    (array_task,) = ids_on(clean, "gpu01")
    (component,) = ids_on(clean, "gpu02")
    assert component != het  # the component's own id; the leader runs on gpu03
    drained = ("gpu01", "gpu02", "gpu04")
    async with running(tmp_path, clean, NoticeSettings(checkpoint_grace_s=2.0)) as rig:
        for n, node in enumerate(drained, start=1):
            rig.box.submit(decision(node, Action.DRAIN, n))

        def closed() -> bool:
            done = [n for n in rig.notices.all() if not n.open]
            return len(done) == len(drained)

        await wait_until(closed, timeout=90, what="three notices closed")
        by_node = {n.node: n for n in rig.notices.all()}
    expected = {"gpu01": array_task, "gpu02": component, "gpu04": ckpt}
    for node, job in expected.items():
        notice = by_node[node]
        assert set(notice.jobs) == {job}, node
        assert (notice.jobs[job].signaled, notice.jobs[job].requeued) == ("done", "done"), node
        assert notice.closed == "requeued"
    assert usr1(jobs, ckpt)
    assert jobs.field(ckpt, "Restarts") == "1"
    assert jobs.field(het, "Restarts") == "1"  # requeued through its leader
    assert jobs.field(array_task, "Restarts") == "1"


def _notice_rows(db_path: Path) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
    with contextlib.closing(sqlite3.connect(db_path)) as db:
        notices = db.execute("SELECT key, told_at, closed_at, closed FROM notices").fetchall()
        jobs = db.execute("SELECT job_id, signaled, requeued FROM notice_jobs").fetchall()
    return notices, jobs


def _spawn(db: Path, cluster: Cluster, grace_s: float, action: str = "") -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "tests.support.notice_process", str(db), str(cluster.conf)]
    return subprocess.Popen(
        [*argv, "gpu04", str(grace_s), *([action] if action else [])],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


async def test_kill_9_between_notice_and_requeue_neither_signals_twice_nor_forgets(
    jobs: Jobs, clean: Cluster, tmp_path: Path
) -> None:
    job = await running_job(jobs, "gpu04")
    db = tmp_path / "outbox.sqlite3"
    first = _spawn(db, clean, 8.0, "drain")
    try:
        await wait_until(lambda: usr1(jobs, job), timeout=60, what="USR1 from the first process")
        await wait_until(
            lambda: db.exists() and _notice_rows(db)[0] and _notice_rows(db)[0][0][1] is not None,
            timeout=30,
            what="the notice recorded as told",
        )
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
    assert _notice_rows(db)[0][0][2] is None  # still open: the requeue is due
    second = _spawn(db, clean, 8.0)
    try:
        await wait_until(
            lambda: _notice_rows(db)[0][0][2] is not None, timeout=60, what="requeue after restart"
        )
    finally:
        second.send_signal(signal.SIGKILL)
        _, err = second.communicate(timeout=10)
    notices, told = _notice_rows(db)
    assert notices[0][3] == "requeued", err[-2000:]
    assert told == [(job, "done", "done")]
    assert jobs.field(job, "Restarts") == "1"
    assert usr1(jobs, job) == ["usr1 restart=0"]  # signalled once, across the kill


def _daemon_config(cluster: Cluster, tmp_path: Path, node: str) -> str:
    return f"""
[node]
name = "{node}"
[api]
port = 0
[sources.gpus]
type = "nvml"
interval_s = 0.05
timeout_s = 0.04
[policy]
min_dwell_s = 0.0
resume_after_s = 0.2
evaluate_interval_s = 0.05
[scheduler]
type = "slurm"
slurm_conf = "{cluster.conf}"
outbox_path = "{tmp_path / "outbox.sqlite3"}"
retry_initial_s = 0.05
retry_max_s = 0.5
reconcile_interval_s = 0
checkpoint_grace_s = 300
"""


async def test_the_daemon_tells_a_job_of_a_hot_gpu_and_shows_the_notice(
    jobs: Jobs, clean: Cluster, tmp_path: Path
) -> None:
    """The whole daemon: a hot GPU -> drain -> USR1 to the job -> /v1/node/notice."""
    job = await running_job(jobs, "gpu01")
    nvml = fake_node()
    for g in nvml.gpus:
        g.temperature_c = 60.0
    cfg = parse_config(_daemon_config(clean, tmp_path, "gpu01"))
    daemon = Daemon(cfg, adapters={"gpus": NvmlAdapter("gpus", nvml)})
    task = asyncio.create_task(daemon.run(handle_signals=False))
    try:
        await asyncio.wait_for(daemon.ready.wait(), 10)
        nvml.gpus[3].temperature_c = 87.0  # 3 C under the H100's slowdown
        await wait_until(lambda: usr1(jobs, job), timeout=60, what="USR1 after the drain")
        url = f"http://127.0.0.1:{daemon.api_port}/v1/node/notice"
        async with aiohttp.ClientSession() as http:

            async def fetch_notice() -> Any:
                async with http.get(url) as resp:
                    return await resp.json()

            # The job can run its trap before scancel's exit reaches the daemon: the
            # outcome shows once the daemon has it ("" while the signal is in flight).
            body = await wait_for_result(
                fetch_notice,
                lambda b: bool(b["notice"]) and all(j["signaled"] for j in b["notice"]["jobs"]),
                timeout=30,
                what="the signal's outcome in the notice",
            )
    finally:
        daemon.stop()
        await asyncio.wait_for(task, 10)
    notice = body["notice"]
    assert (
        notice["action"] == "drain"
        and "gpu3" in notice["reason"]
        and notice["reason"].startswith("rackguard")
    )
    assert notice["checkpoint_by"] == pytest.approx(notice["noticed_at"] + 300)
    assert [(j["job_id"], j["signaled"]) for j in notice["jobs"]] == [(job, "done")]
    assert len(usr1(jobs, job)) == 1  # told once
    assert "DRAIN" in clean.show("gpu01")
