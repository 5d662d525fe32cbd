"""The command-line path on a real Slurm 24.11: scontrol, squeue and scancel run inside
the chroot through the configured ``command_prefix``, wired from the config as the
daemon wires them (Debian 12's 22.05 client tools cannot talk to a 24.11 controller)."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from adapters.schedulers.jobs import JobControl, NoticeTerms, Outcome, RunningJob
from adapters.schedulers.slurm.jobs import NOT_HERE
from adapters.schedulers.slurm.sink import SlurmSink
from daemon.config.scheduler import SlurmSchedulerConfig
from daemon.delivery.outbox import Status
from daemon.delivery.sinks import build_backend, build_job_notices
from policies.model import Action
from tests.support.delivery import StoreAndDeliverer as Outbox
from tests.support.slurm import NODES, decision, deliver_all
from tests.support.slurm24 import Slurm24, assert_listed
from tests.support.wait import wait_until

pytestmark = pytest.mark.slurm

USR1 = NoticeTerms("USR1", 0.0, "rackguard: test", "gpu")


@pytest.fixture
def config(slurm24: Slurm24) -> SlurmSchedulerConfig:
    return SlurmSchedulerConfig(
        type="slurm",
        command_prefix=("chroot", str(slurm24.root)),
        slurm_conf=slurm24.cluster.conf,
        timeout_s=20.0,
        exclude_state="down",
    )


@pytest.fixture
async def wired(config: SlurmSchedulerConfig) -> AsyncIterator[tuple[SlurmSink, JobControl]]:
    backend = build_backend(config, 600.0)
    sink = backend.sink()
    notices = build_job_notices(config, 600.0, backend)
    assert isinstance(sink, SlurmSink) and notices is not None
    yield sink, notices[0]
    await sink.close()


@pytest.fixture
def outbox(tmp_path: Path, wired: tuple[SlurmSink, JobControl]) -> Iterator[Outbox]:
    box = Outbox(tmp_path / "outbox.sqlite3", wired[0], retry_initial_s=0.05, retry_max_s=0.2)
    yield box
    box.close()


async def test_slurm24_scontrol_reads_and_writes_nodes_in_the_chroot(
    slurm24: Slurm24, wired: tuple[SlurmSink, JobControl], outbox: Outbox
) -> None:
    sink, _ = wired
    views = await sink.read_state([*NODES, "gpu99"])
    assert [views[n].exists for n in NODES] == [True] * 4 and not views["gpu99"].exists
    assert sorted(n.view.node for n in await sink.list_nodes()) == list(NODES)
    await deliver_all(outbox, decision("gpu03", Action.DRAIN))
    shown = slurm24.cluster.show("gpu03")
    assert "State=IDLE+DRAIN" in shown and "Reason=rackguard[gpu]: real slurm drain #1" in shown
    await deliver_all(outbox, decision("gpu03", Action.EXCLUDE, 2))
    assert "State=DOWN" in slurm24.cluster.show("gpu03")
    await deliver_all(outbox, decision("gpu03", Action.RESUME, 3))
    assert not (await sink.read_state(["gpu03"]))["gpu03"].held
    slurm24.cluster.scontrol("update", "nodename=gpu04", "state=drain", "reason=maint ticket-9")
    await deliver_all(outbox, decision("gpu04", Action.DRAIN, 4))
    await deliver_all(outbox, decision("gpu04", Action.RESUME, 5))
    assert "Reason=maint ticket-9" in slurm24.cluster.show("gpu04")
    statuses = [r.status for r in await outbox.history()]
    assert statuses.count(Status.CONFIRMED) == 3 and statuses.count(Status.SKIPPED) == 2


async def test_slurm24_squeue_scancel_and_requeue_in_the_chroot(
    slurm24: Slurm24, wired: tuple[SlurmSink, JobControl]
) -> None:
    _, jobs = wired
    keep, stay = slurm24.keep_and_stay()
    await assert_listed(jobs, keep, stay)
    await wait_until(lambda: slurm24.starts(keep), timeout=15)  # USR1 is trapped from here
    (kept,) = await jobs.running("gpu01")
    (stays,) = await jobs.running("gpu02")
    assert await jobs.notify(kept, USR1) == (Outcome.DONE, "ok")
    await wait_until(lambda: slurm24.usr1(keep) == 1, timeout=10)
    assert (await jobs.requeue(kept))[0] is Outcome.DONE
    assert slurm24.show_job(keep)["Restarts"] == "1"
    outcome, said = await jobs.requeue(stays)
    assert outcome is Outcome.REFUSED and "disabled" in said
    assert slurm24.job_state(stay) == "RUNNING"
    outcome, _ = await jobs.notify(RunningJob("999999", "x", "root", node="gpu02"), USR1)
    assert outcome is Outcome.GONE
    # A job listed on gpu02 is not acted on as gpu01's.
    assert await jobs.notify(dataclasses.replace(stays, node="gpu01"), USR1) == (
        Outcome.GONE,
        NOT_HERE,
    )
