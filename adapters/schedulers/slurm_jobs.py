"""Running Slurm jobs through the commands: ``squeue``, ``scancel --signal``, ``scontrol requeue``.

- List: ``squeue -h -w NODE -t RUNNING -o '%i|%j|%u'`` (array elements as ``123_4``).
- Notify: ``scancel --signal=USR1 --full JOB`` reaches the batch shell, its
  children and every step (``--batch``: the batch shell only; no flag: the steps only).
- Requeue: ``scontrol requeue JOB`` -> PENDING (Reason=BeginTime), Restarts+1.
  A job submitted with ``--no-requeue`` answers "Requested operation is presently
  disabled": it is left running.

Every command has a timeout; a failure to run one is JobControlError (retry).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from adapters.schedulers.command import run_command
from adapters.schedulers.jobs import JobControlError, NoticeTerms, Outcome, RunningJob

SignalScope = Literal["full", "batch", "steps"]
_SCOPE_FLAG = {"full": ("--full",), "batch": ("--batch",), "steps": ()}
_GONE = ("invalid job id", "already completing or completed", "job has finished")
_REFUSED = ("presently disabled", "not permitted", "permission denied", "invalid user")


class SlurmJobs:
    """JobControl for Slurm through squeue, scancel and scontrol."""

    def __init__(
        self,
        *,
        squeue: Sequence[str] = ("squeue",),
        scancel: Sequence[str] = ("scancel",),
        scontrol: Sequence[str] = ("scontrol",),
        scope: SignalScope = "full",
        slurm_conf: Path | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        self.name = "slurm"
        self._squeue = tuple(squeue)
        self._scancel = tuple(scancel)
        self._scontrol = tuple(scontrol)
        self._scope = scope
        self._env = dict(os.environ)
        if slurm_conf is not None:
            self._env["SLURM_CONF"] = str(slurm_conf)
        self._timeout_s = timeout_s

    async def _run(self, argv: Sequence[str]) -> tuple[int, str, str]:
        try:
            return await run_command(argv, self._timeout_s, self._env)
        except OSError as err:
            raise JobControlError(f"cannot run {argv[0]!r}: {err}") from err
        except TimeoutError as err:
            raise JobControlError(f"{argv[0]} timed out after {self._timeout_s:.0f}s") from err

    async def running(self, node: str) -> list[RunningJob]:
        """The jobs RUNNING on ``node``."""
        argv = [*self._squeue, "-h", "-w", node, "-t", "RUNNING", "-o", "%i|%j|%u"]
        rc, out, err = await self._run(argv)
        if rc != 0:
            raise JobControlError(f"squeue -w {node}: rc={rc}: {err or out}")
        return parse_squeue(out)

    async def notify(self, job: RunningJob, terms: NoticeTerms) -> tuple[Outcome, str]:
        """``scancel --signal=SIG [--full|--batch] JOB``."""
        signal = terms.signal
        flags = _SCOPE_FLAG[self._scope]
        rc, out, err = await self._run([*self._scancel, f"--signal={signal}", *flags, job.job_id])
        return self._outcome(f"scancel --signal={signal}", job, rc, out, err)

    async def revise(self, job: RunningJob, terms: NoticeTerms | None) -> tuple[Outcome, str]:
        """Nothing: a signal carries no deadline and cannot be taken back."""
        return Outcome.REFUSED, "a signal cannot be revised"

    async def requeue(self, job: RunningJob) -> tuple[Outcome, str]:
        """``scontrol requeue JOB``."""
        rc, out, err = await self._run([*self._scontrol, "requeue", job.job_id])
        return self._outcome("scontrol requeue", job, rc, out, err)

    @staticmethod
    def _outcome(what: str, job: RunningJob, rc: int, out: str, err: str) -> tuple[Outcome, str]:
        said = (err or out).strip()
        low = said.lower()
        if rc == 0 and not low:
            return Outcome.DONE, "ok"
        if any(s in low for s in _GONE):
            return Outcome.GONE, said
        if any(s in low for s in _REFUSED):
            return Outcome.REFUSED, said
        if rc == 0:  # scancel prints a warning yet succeeds for some states
            return Outcome.DONE, said
        raise JobControlError(f"{what} {job.job_id}: rc={rc}: {said}")


def parse_squeue(text: str) -> list[RunningJob]:
    """Jobs from ``squeue -h -o '%i|%j|%u'`` lines; malformed lines are skipped."""
    jobs = []
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 3 or not parts[0] or not parts[0].replace("_", "").isdigit():
            continue
        jobs.append(RunningJob(parts[0], parts[1], parts[2]))
    return jobs
