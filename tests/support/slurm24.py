"""A real Slurm 24.11 for the tests: start-slurm24.sh's cluster in its Debian 13 chroot, and jobs.

Every Slurm command runs inside the chroot (``Cluster.prefix``); files the jobs
write live in the tree, under the cluster's ``jobs`` directory.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from adapters.schedulers.jobs import JobControl
from tests.support.paths import ROOT
from tests.support.slurm import NODES, Cluster, free_ports

# Every data-parser version 24.11 serves; rackguard claims all three.
VERSIONS = ("v0.0.40", "v0.0.41", "v0.0.42")
CPUS = 2  # per node: a heterogeneous job's and an array's parts run side by side

# A batch job that records each USR1 it gets and each start (SLURM_RESTART_COUNT).
JOB_SCRIPT = """#!/bin/sh
out={out}/$SLURM_JOB_ID
trap 'echo USR1 >> "$out.usr1"' USR1
echo "start ${{SLURM_RESTART_COUNT:-0}}" >> "$out.log"
while :; do sleep 0.1; done
"""


@dataclass(frozen=True)
class Slurm24:
    """What start-slurm24.sh printed, and the tree its daemons run in."""

    cluster: Cluster
    root: Path  # the chroot
    inner: Path  # the cluster's directory as the daemons see it

    def host(self, inner: Path) -> Path:
        """A path inside the tree, as seen from here."""
        return self.root / inner.relative_to("/")

    @property
    def script(self) -> Path:
        """The job script, inside the tree."""
        return self.inner / "jobs" / "job.sh"

    def sbatch(self, *options: str) -> str:
        """Submit the job script with ``options``; its job id."""
        done = self.cluster.run(
            "sbatch", "--parsable", "-o", "/dev/null", *options, str(self.script)
        )
        return done.stdout.strip().split(";")[0]

    def keep_and_stay(self) -> tuple[str, str]:
        """Two running jobs: "keep" on gpu01 (requeueable), "stay" on gpu02 (--no-requeue)."""
        keep = self.sbatch("-w", "gpu01", "--requeue", "-J", "keep")
        stay = self.sbatch("-w", "gpu02", "--no-requeue", "-J", "stay")
        self.wait_running(keep, stay)
        return keep, stay

    def show_job(self, job_id: str) -> dict[str, str]:
        """``scontrol -o show job`` as Key=Value pairs (the first record of a het/array job)."""
        line = self.cluster.scontrol("-o", "show", "job", job_id).stdout.splitlines()[0]
        return dict(f.split("=", 1) for f in line.split() if "=" in f)

    def job_state(self, job_id: str) -> str:
        """The job's state, "" once Slurm forgot it."""
        done = self.cluster.run("squeue", "-h", "-j", job_id, "-o", "%T", check=False)
        return done.stdout.strip().splitlines()[0] if done.stdout.strip() else ""

    def wait_running(self, *job_ids: str, timeout: float = 30.0) -> None:
        """Until every job is RUNNING (each het component / array task by its own id)."""
        deadline = time.monotonic() + timeout
        while True:
            states = [self.job_state(j) for j in job_ids]
            if all(s == "RUNNING" for s in states):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"jobs {job_ids} not running after {timeout}s: {states}")
            time.sleep(0.1)

    def array_task_ids(self, array: str) -> list[str]:
        """The job ids of an array's tasks, in task order (what SLURM_JOB_ID says in each)."""
        out = self.cluster.run("squeue", "-h", "-r", "-j", array, "-o", "%K %A").stdout
        pairs = sorted((int(k), a) for k, a in (ln.split() for ln in out.splitlines()))
        return [a for _, a in pairs]

    def usr1(self, job_id: str) -> int:
        """How many USR1 the job's batch shell has trapped."""
        path = self.host(self.inner / "jobs" / "out" / f"{job_id}.usr1")
        return len(path.read_text().splitlines()) if path.exists() else 0

    def starts(self, job_id: str) -> list[str]:
        """The batch shell's start lines ("start 0", "start 1" after a requeue)."""
        path = self.host(self.inner / "jobs" / "out" / f"{job_id}.log")
        return path.read_text().splitlines() if path.exists() else []

    def token(self, user: str = "root", lifespan: int = 600) -> str:
        """A fresh JWT for ``user`` from ``scontrol token``."""
        said = self.cluster.scontrol("token", f"username={user}", f"lifespan={lifespan}").stdout
        return said.strip().removeprefix("SLURM_JWT=")

    def cancel_all(self) -> None:
        """Cancel every job (between tests)."""
        self.cluster.run("scancel", "--user=root", check=False)


async def assert_listed(jobs: JobControl, keep: str, stay: str) -> None:
    """``keep_and_stay``'s jobs, each listed on its own node only."""
    for node, job, name in (("gpu01", keep, "keep"), ("gpu02", stay, "stay")):
        listed = [(j.job_id, j.acted_on, j.name, j.user, j.node) for j in await jobs.running(node)]
        assert listed == [(job, job, name, "root", node)]
    assert await jobs.running("gpu03") == []


def start(work: Path) -> Slurm24:
    """Build the tree if needed and start the cluster on free ports under ``work``."""
    ctld, rest, *slurmd = free_ports(2 + len(NODES))
    env = dict(
        os.environ,
        SLURM24_CI_NODES=str(len(NODES)),
        SLURM24_CI_CPUS=str(CPUS),
        SLURM24_CI_CTLD_PORT=str(ctld),
        SLURM24_CI_REST_PORT=str(rest),
        SLURM24_CI_SLURMD_BASE_PORT=str(slurmd[0]),
    )
    started = subprocess.run(
        [str(ROOT / "scripts/start-slurm24.sh"), str(work)],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,  # a first run debootstraps the tree (about a minute here)
    )
    assert started.returncode == 0, started.stderr
    values = dict(line.split("=", 1) for line in started.stdout.splitlines() if "=" in line)
    root = Path(values["SLURM_CHROOT"])
    conf = Path(values["SLURM_CONF"])
    cluster = Cluster(
        work,
        conf,
        values["SLURM_REST_URL"],
        Path(values["SLURM_JWT_FILE"]),
        dict(os.environ, SLURM_CONF=str(conf)),
        prefix=("chroot", str(root)),
    )
    slurm = Slurm24(cluster, root, conf.parent.parent)
    out = slurm.host(slurm.inner / "jobs" / "out")
    out.mkdir(parents=True, exist_ok=True)
    out.chmod(0o777)
    script = slurm.host(slurm.script)
    script.write_text(JOB_SCRIPT.format(out=slurm.inner / "jobs" / "out"))
    script.chmod(0o755)
    return slurm


def stop(work: Path) -> None:
    """Stop the cluster and delete its files (the cached tree stays)."""
    subprocess.run(
        [str(ROOT / "scripts/stop-slurm24.sh"), str(work)],
        check=False,
        env=dict(os.environ, SLURM_CI_PURGE="1"),
        capture_output=True,
        timeout=120,
    )
