"""What scancel / scontrol print, read into outcomes (the words of 22.05)."""

from __future__ import annotations

import pytest

from adapters.schedulers.base import NodeView
from adapters.schedulers.jobs import JobControlError, Outcome, RunningJob
from adapters.schedulers.slurm.client import SlurmClient
from adapters.schedulers.slurm.jobs import SlurmJobs
from policies.model import Action

JOB = RunningJob("7")


@pytest.mark.parametrize(
    ("rc", "out", "err", "expected"),
    [
        (0, "", "", Outcome.DONE),
        (
            1,
            "",
            "scancel: error: Kill job error on job id 7: Invalid job id specified",
            Outcome.GONE,
        ),
        (1, "Requested operation is presently disabled for job 7", "", Outcome.REFUSED),
        (
            1,
            "",
            "scancel: error: Kill job error on job id 7: Job/step already completing or completed",
            Outcome.GONE,
        ),
        (1, "", "Access/permission denied", Outcome.REFUSED),
    ],
)
def test_command_answers_become_outcomes(rc: int, out: str, err: str, expected: Outcome) -> None:
    outcome, said = SlurmJobs._outcome("scontrol requeue", JOB, rc, out, err)
    assert outcome is expected and (said == "ok" if expected is Outcome.DONE else said)


def test_an_unknown_failure_is_retried_not_guessed() -> None:
    with pytest.raises(JobControlError, match=r"scontrol requeue 7: rc=1: Unable to contact slurm"):
        SlurmJobs._outcome("scontrol requeue", JOB, 1, "", "Unable to contact slurm controller")


async def test_a_missing_command_is_an_error_to_retry() -> None:
    jobs = SlurmJobs(SlurmClient(None), squeue=("/nonexistent/squeue",))
    with pytest.raises(JobControlError, match="cannot run '/nonexistent/squeue'"):
        await jobs.running("gpu01")


@pytest.mark.parametrize(
    ("view", "down_mode", "drain_mode"),
    [
        (NodeView("n", drained=True, reason="rackguard: hot"), False, True),
        (NodeView("n", down=True, reason="rackguard: hot"), True, True),
        (NodeView("n"), False, False),
        (NodeView("n", drained=True, reason="maint"), False, False),
    ],
)
def test_an_exclusion_carried_out_as_a_drain_reads_back_as_drained(
    view: NodeView, down_mode: bool, drain_mode: bool
) -> None:
    assert view.satisfies(Action.EXCLUDE) is down_mode
    assert view.satisfies(Action.EXCLUDE, exclude_down=False) is drain_mode
