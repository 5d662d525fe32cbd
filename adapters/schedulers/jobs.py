"""What a scheduler offers for the work already running on a node: list, notify, requeue.

A drain stops new work only; the job already on the node is told (a Slurm
signal, a Kubernetes pod annotation and Event) and, after its grace, requeued
(Slurm) or evicted (Kubernetes) — never killed. Each scheduler implements JobControl.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class RunningJob:
    """One job running on the node (at least partly), as the scheduler listed it.

    ``job_id`` is what the job is told through (Slurm: the numeric job id, one per
    array task and heterogeneous component; Kubernetes: ``namespace/name``).
    ``name`` and ``user`` were written by the job's owner: shown, never parsed.
    Every action re-checks the job against ``node`` (and ``uid``) at the scheduler.
    """

    job_id: str
    name: str = ""
    user: str = ""
    node: str = ""  # the node it was listed on
    label: str = ""  # how the scheduler shows it (Slurm: 3_0, 6+1); "" = job_id
    # What a signal or a requeue names, where that is not job_id (Slurm: a hetjob's
    # leader, the only id that reaches its batch shell; an array task as ARRAY_TASK,
    # since the task that runs under the array's own id would, by that id, name every
    # task of the array on every node).
    target: str = ""
    uid: str = ""  # Kubernetes: the pod's uid as listed

    @property
    def acted_on(self) -> str:
        """The id a signal or a requeue names."""
        return self.target or self.job_id

    @property
    def shown(self) -> str:
        """The id people know the job by."""
        return self.label or self.job_id


class Outcome(enum.StrEnum):
    """What became of one notice or requeue request."""

    DONE = "done"  # signalled / requeued
    GONE = "gone"  # the job ended before we got to it
    REFUSED = "refused"  # the scheduler will not (e.g. a job submitted with --no-requeue)
    BLOCKED = "blocked"  # not now (a PodDisruptionBudget): asked again later, with backoff


@dataclass(frozen=True, slots=True)
class NoticeTerms:
    """What a job is told: how, by when, and why."""

    signal: str  # how: a signal name ("USR1") or the scheduler's own means ("annotation")
    checkpoint_by: float  # Unix time
    reason: str
    domain: str


class JobControlError(Exception):
    """The scheduler could not be asked (unreachable, timed out): retry later.

    ``permanent``: refused for a cause an operator fixes (a missing permission, a
    token it will not take): retried much more slowly and reported, like a
    refused delivery. ``reason`` is a short metric label.
    """

    def __init__(self, message: str, *, permanent: bool = False, reason: str = "") -> None:
        super().__init__(message)
        self.permanent = permanent
        self.reason = reason or ("refused" if permanent else "unreachable")


class JobControl(Protocol):
    """Running work on one scheduler's nodes."""

    name: str

    async def running(self, node: str) -> Sequence[RunningJob]:
        """The jobs running on ``node`` now; raises JobControlError."""

    async def notify(self, job: RunningJob, terms: NoticeTerms) -> tuple[Outcome, str]:
        """Tell the job (e.g. send ``terms.signal``); (outcome, the scheduler's words)."""

    async def revise(self, job: RunningJob, terms: NoticeTerms | None) -> tuple[Outcome, str]:
        """A job told before: make what it was told say ``terms`` (None: take it back).

        Idempotent: called again after a restart, or for a job already told these
        terms, it changes nothing. A scheduler whose notice carries no terms (a
        signal) does nothing and answers REFUSED.
        """

    async def requeue(self, job: RunningJob) -> tuple[Outcome, str]:
        """Move the job off the node to run again elsewhere or later (requeue, evict).

        (outcome, the scheduler's words); BLOCKED: ask again later.
        """


@dataclass(frozen=True, slots=True)
class JobHandling:
    """A backend's job control and what its config asks of it."""

    control: JobControl
    signal: str  # how a job is told: a signal name ("USR1") or the scheduler's own means
    requeue: bool  # move work still running at the deadline (requeue, evict)
