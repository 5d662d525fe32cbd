"""What a scheduler offers for the work already running on a node: list, notify, requeue.

A drain stops new work only; the job already on the node is told (a signal) and,
after its grace, requeued — never killed. Each scheduler implements JobControl.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class RunningJob:
    """One job running on the node (at least partly)."""

    job_id: str
    name: str = ""
    user: str = ""


class Outcome(enum.StrEnum):
    """What became of one notice or requeue request."""

    DONE = "done"  # signalled / requeued
    GONE = "gone"  # the job ended before we got to it
    REFUSED = "refused"  # the scheduler will not (e.g. a job submitted with --no-requeue)


class JobControlError(Exception):
    """The scheduler could not be asked (unreachable, timed out): retry later."""


class JobControl(Protocol):
    """Running work on one scheduler's nodes."""

    name: str

    async def running(self, node: str) -> Sequence[RunningJob]:
        """The jobs running on ``node`` now; raises JobControlError."""

    async def notify(self, job: RunningJob, signal: str) -> tuple[Outcome, str]:
        """Send ``signal`` (e.g. "USR1") to the job; (outcome, the scheduler's words)."""

    async def requeue(self, job: RunningJob) -> tuple[Outcome, str]:
        """Put the job back in the queue to run again later; (outcome, the scheduler's words)."""
