"""Running Slurm jobs through the commands: squeue --json, scancel --signal, scontrol requeue.

- List: ``squeue --json`` (22.05 ignores every filter with --json and prints
  all jobs; later versions may filter: the list is filtered here either way),
  read through one typed model (job_list.py): a job name or user text is
  a JSON string, never a field separator. A list that is cut (past
  JOB_LIST_LIMIT), late or malformed is an error: nothing is concluded from it.
- Confirm: before a signal or a requeue, ``squeue -h -j ID -t RUNNING -o "%A %N"``
  must print that id with a node list holding this node: the job runs here now.
  Its output holds no field a user writes. No ``-w``: on 24.11 it costs slurmctld
  a full node dump per call.
- Notify: ``scancel --signal=USR1 --full JOB`` reaches the batch shell, its
  children and every step (``--batch``: the batch shell only; no flag: the steps only).
- Requeue: ``scontrol requeue JOB`` -> PENDING (Reason=BeginTime), Restarts+1; a
  heterogeneous job through its leader. A job submitted with ``--no-requeue``
  answers "Requested operation is presently disabled": it is left running.

Every command has a timeout; a failure to run one is JobControlError (retry).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from adapters.schedulers.command import OUTPUT_LIMIT, OutputTooLarge
from adapters.schedulers.jobs import JobControlError, NoticeTerms, Outcome, RunningJob
from adapters.schedulers.slurm.client import SlurmClient
from adapters.schedulers.slurm.hostlist import HostlistError, hostlist_has
from adapters.schedulers.slurm.job_list import JobListError, decode_json, running_on

SignalScope = Literal["full", "batch", "steps"]
_SCOPE_FLAG = {"full": ("--full",), "batch": ("--batch",), "steps": ()}
_GONE = ("invalid job id", "already completing or completed", "job has finished")
_REFUSED = ("presently disabled", "not permitted", "permission denied", "invalid user")
# squeue --json is ~3.6 KB a job on 22.05 (it lists every job in the cluster).
JOB_LIST_LIMIT = 128 * 1024 * 1024
NOT_HERE = "no longer running on this node"


class SlurmJobs:
    """JobControl for Slurm through squeue, scancel and scontrol."""

    def __init__(
        self,
        client: SlurmClient,
        *,
        squeue: Sequence[str] = ("squeue",),
        scancel: Sequence[str] = ("scancel",),
        scope: SignalScope = "full",
    ) -> None:
        self.name = "slurm"
        self._client = client  # its scontrol, SLURM_CONF and timeout
        self._squeue = tuple(squeue)
        self._scancel = tuple(scancel)
        self._scope = scope

    async def _run(self, argv: Sequence[str], limit: int = OUTPUT_LIMIT) -> tuple[int, str, str]:
        try:
            return await self._client.run(argv, limit)
        except OSError as err:
            raise JobControlError(f"cannot run {argv[0]!r}: {err}") from err
        except TimeoutError as err:
            timeout = self._client.timeout_s
            raise JobControlError(f"{argv[0]} timed out after {timeout:.0f}s") from err
        except OutputTooLarge as err:
            raise JobControlError(f"the job list is not whole: {err}", reason="incomplete") from err

    async def running(self, node: str) -> list[RunningJob]:
        """The jobs RUNNING on ``node``, from the whole structured job list."""
        # No -w: it costs slurmctld a full node dump per call (measured on 24.11; 22.05
        # ignores filters with --json anyway). The list is filtered here.
        argv = [*self._squeue, "--json"]
        rc, out, err = await self._run(argv, JOB_LIST_LIMIT)
        if rc != 0:
            raise JobControlError(f"squeue --json: rc={rc}: {(err or out)[:300]}")
        try:
            return running_on(decode_json(out), node)
        except JobListError as error:
            raise JobControlError(f"squeue --json: {error}", reason="malformed") from error

    async def here(self, job: RunningJob) -> bool:
        """Whether ``job`` runs on the node it was listed on, now (asked by id)."""
        if not job.node or not job.job_id.isdigit():
            return False  # never act on a job that cannot be checked against its node
        # %A (the numeric id) and %N (the node list): fields no user writes. No -w,
        # which costs slurmctld a full node dump; the node list is read here.
        argv = [*self._squeue, "-h", "-j", job.job_id, "-t", "RUNNING", "-o", "%A %N"]
        rc, out, err = await self._run(argv)
        if rc != 0:
            if "invalid job id" in (err or out).lower():
                return False  # gone from slurmctld's memory
            raise JobControlError(f"squeue -j {job.job_id}: rc={rc}: {(err or out)[:300]}")
        for line in out.splitlines():
            job_id, _, nodes = line.strip().partition(" ")
            if job_id != job.job_id:
                continue  # a hetjob leader's id lists its components, an array's its tasks
            try:
                return hostlist_has(nodes.strip(), job.node)
            except HostlistError as err:
                raise JobControlError(f"squeue -j {job.job_id}: {err}") from err
        return False

    async def notify(self, job: RunningJob, terms: NoticeTerms) -> tuple[Outcome, str]:
        """``scancel --signal=SIG [--full|--batch] JOB``, once the job is confirmed here."""
        if not await self.here(job):
            return Outcome.GONE, NOT_HERE
        signal = terms.signal
        flags = _SCOPE_FLAG[self._scope]
        argv = [*self._scancel, f"--signal={signal}", *flags, job.acted_on]
        rc, out, err = await self._run(argv)
        return self._outcome(f"scancel --signal={signal}", job, rc, out, err)

    async def revise(self, job: RunningJob, terms: NoticeTerms | None) -> tuple[Outcome, str]:
        """Nothing: a signal carries no deadline and cannot be taken back."""
        return Outcome.REFUSED, "a signal cannot be revised"

    async def requeue(self, job: RunningJob) -> tuple[Outcome, str]:
        """``scontrol requeue JOB`` (a heterogeneous job's leader), once confirmed here."""
        if not await self.here(job):
            return Outcome.GONE, NOT_HERE
        return await self.send_requeue(job)

    async def send_requeue(self, job: RunningJob) -> tuple[Outcome, str]:
        """``scontrol requeue`` for a job its caller has just confirmed on the node."""
        argv = [*self._client.scontrol_argv, "requeue", job.acted_on]
        rc, out, err = await self._run(argv)
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
        raise JobControlError(f"{what} {job.acted_on}: rc={rc}: {said}")
