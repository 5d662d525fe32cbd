"""The JobControl port, scripted, for tests of what the store and the API do with notices.

Slurm itself is tested with real batch jobs (tests/adapters/schedulers/slurm/test_slurm_jobs.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from adapters.schedulers.jobs import JobControlError, NoticeTerms, Outcome, RunningJob


class ScriptedJobs:
    """The JobControl port, scripted: jobs per node; records each signal and requeue."""

    name = "scripted"

    def __init__(self, jobs: dict[str, list[str]]) -> None:
        self.jobs = jobs
        self.signals: list[str] = []
        self.requeues: list[str] = []
        self.revisions: list[tuple[str, NoticeTerms | None]] = []
        self.down = False
        self.no_requeue: set[str] = set()
        self.notify_failures = 0  # the next N signals fail as an unreachable scheduler does

    async def running(self, node: str) -> Sequence[RunningJob]:
        if self.down:
            raise JobControlError("slurmctld unreachable")
        return [RunningJob(j, "train", "alice") for j in self.jobs.get(node, [])]

    async def notify(self, job: RunningJob, terms: NoticeTerms) -> tuple[Outcome, str]:
        if self.notify_failures > 0:
            self.notify_failures -= 1
            raise JobControlError("slurmctld unreachable")
        self.signals.append(job.job_id)
        return Outcome.DONE, "ok"

    async def revise(self, job: RunningJob, terms: NoticeTerms | None) -> tuple[Outcome, str]:
        self.revisions.append((job.job_id, terms))
        return Outcome.REFUSED, "a signal cannot be revised"  # as Slurm

    async def requeue(self, job: RunningJob) -> tuple[Outcome, str]:
        if job.job_id in self.no_requeue:
            return Outcome.REFUSED, "Requested operation is presently disabled"
        self.requeues.append(job.job_id)
        for jobs in self.jobs.values():
            if job.job_id in jobs:
                jobs.remove(job.job_id)
        return Outcome.DONE, "ok"
