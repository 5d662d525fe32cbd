"""The Slurm scheduler's command prefix (a wrapper, or a chroot holding Slurm 24.11's
client tools) and the signal names Slurm knows, as the config loader checks them."""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path

import pytest

from adapters.base import DeliveryError
from adapters.schedulers.base import NodeReadError
from adapters.schedulers.jobs import JobControlError, NoticeTerms, RunningJob
from adapters.schedulers.slurm.sink import SlurmSink
from daemon.config import ConfigError, parse_config
from daemon.config.scheduler import SlurmSchedulerConfig
from daemon.delivery.sinks import build_backend, build_job_notices
from policies.model import Action
from tests.daemon.config.test_config import slurm_example
from tests.support.slurm import decision


def _with(line: str) -> str:
    key = line.split(" = ", maxsplit=1)[0]
    lines = slurm_example().splitlines()
    if any(x.startswith(f"{key} = ") for x in lines):
        return "\n".join(line if x.startswith(f"{key} = ") else x for x in lines) + "\n"
    return "\n".join(lines) + f"\n{line}\n"


def _problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    return list(info.value.problems)


async def test_slurm24_the_prefix_goes_before_every_slurm_command(tmp_path: Path) -> None:
    # A site's wrapper: it records what it was asked to run, then fails as a dead
    # controller would.
    said = tmp_path / "argv"
    wrap = tmp_path / "wrap"
    # It fails every command, but says job 7 runs on gpu01 when asked by id (squeue -j),
    # so the signal and the requeue are tried too.
    wrap.write_text(
        f'#!/bin/sh\necho "$*" >> {said}\n'
        'case "$*" in *squeue*-j*) echo "7 gpu01"; exit 0;; esac\nexit 1\n'
    )
    wrap.chmod(0o755)
    cfg = parse_config(_with(f'command_prefix = ["{wrap}", "--site"]')).scheduler
    assert isinstance(cfg, SlurmSchedulerConfig)
    cfg = dataclasses.replace(cfg, rest_url="", token_file=None)  # the commands only
    backend = build_backend(cfg, 600.0)
    sink = backend.sink()
    notices = build_job_notices(cfg, 600.0, backend)
    assert isinstance(sink, SlurmSink) and notices is not None
    jobs = notices[0]
    with pytest.raises(NodeReadError):
        await sink.read_state(["gpu01"])
    with pytest.raises(DeliveryError):
        await sink.deliver(decision("gpu01", Action.DRAIN))
    with pytest.raises(JobControlError):
        await jobs.running("gpu01")
    with contextlib.suppress(JobControlError):
        await jobs.notify(RunningJob("7", node="gpu01"), NoticeTerms("USR1", 0.0, "test", "gpu"))
    with contextlib.suppress(JobControlError):
        await jobs.requeue(RunningJob("7", node="gpu01"))
    words = [line.split()[:2] for line in said.read_text().splitlines()]
    assert words == [
        ["--site", "scontrol"],  # read
        ["--site", "scontrol"],  # drain
        ["--site", "squeue"],  # the job list
        ["--site", "squeue"],  # job 7 on gpu01?
        ["--site", "scancel"],
        ["--site", "squeue"],
        ["--site", "scontrol"],  # requeue
    ]
    # The token refresh is a whole command of its own: no prefix.
    assert cfg.token_refresh_command == ("scontrol", "token", "lifespan=3600")


def test_slurm24_no_prefix_by_default() -> None:
    cfg = parse_config(slurm_example()).scheduler
    assert isinstance(cfg, SlurmSchedulerConfig)
    assert cfg.command_prefix == () and cfg.command(cfg.squeue) == ("squeue",)


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ('command_prefix = ["chroot"]', "scheduler.command_prefix: chroot needs the directory"),
        (
            'command_prefix = ["/usr/sbin/chroot", "/nonexistent/slurm24"]',
            "scheduler.command_prefix: chroot directory '/nonexistent/slurm24' does not exist",
        ),
        ('command_prefix = ["sudo", ""]', "scheduler.command_prefix: word 1 is empty"),
        ('command_prefix = "chroot /srv"', "scheduler.command_prefix"),
        ("command_prefix = [1]", "scheduler.command_prefix"),
        ('notice_signal = "WINCH"', "scheduler.notice_signal: Slurm does not know the signal"),
        ('notice_signal = "PWR"', "scheduler.notice_signal: Slurm does not know the signal"),
    ],
)
def test_slurm24_bad_prefix_or_signal_names_the_key(line: str, problem: str) -> None:
    problems = _problems(_with(line))
    assert any(p.startswith(problem) for p in problems), problems


@pytest.mark.parametrize("name", ["USR1", "USR2", "HUP", "URG", "CONT", "ALRM"])
def test_slurm24_signals_slurm_knows_are_taken(name: str) -> None:
    cfg = parse_config(_with(f'notice_signal = "{name}"')).scheduler
    assert isinstance(cfg, SlurmSchedulerConfig) and cfg.notice_signal == name
