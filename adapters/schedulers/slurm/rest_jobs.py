"""Running Slurm jobs through slurmrestd (Slurm >= 23.02), the commands where REST cannot.

Paths and parameters follow Slurm 24.11's OpenAPI document (v0.0.42; v0.0.39
to v0.0.41 have the same ones):

- List: ``GET /slurm/<v>/jobs/``. It takes no node filter (only ``update_time``
  and ``flags``), so the list is filtered here, through the typed model of
  job_list.py: ``job_state`` holds ``RUNNING`` and the hostlist in
  ``nodes`` names the node. A list that cannot be read whole is an error.
- Confirm: before a signal or a requeue, ``GET /slurm/<v>/job/{job_id}`` must
  show the job RUNNING on this node.
- Notify: ``DELETE /slurm/<v>/job/{job_id}?signal=USR1&flags=FULL_JOB``; the
  scope maps to ``flags`` as scancel's options do: full -> FULL_JOB (batch
  shell, its children, every step), batch -> BATCH_JOB, steps ->
  FULL_STEPS_ONLY. Without ``flags`` slurmrestd itself defaults to FULL_JOB.
  A heterogeneous job is signalled through its leader's id (``het_job_id``),
  an array task as ``ARRAYID_TASK`` (see ``_job_ref``).
  slurmrestd's handler of that path rejects a job id at or above MAX_JOB_ID
  (0x03FFFFFF) before asking slurmctld — every job of a federation member, whose
  top bits carry the cluster — so those go through ``DELETE /slurm/<v>/jobs/``
  with the body ``{"jobs": [id], "signal": ..., "flags": [...]}``
  (``kill_jobs_msg``) where the server lists it.
- Requeue: v0.0.42 has no requeue endpoint (``POST /slurm/<v>/job/{job_id}``
  updates the job's description; its ``requeue`` field is the permission
  ``--requeue`` sets, not the action), so ``scontrol requeue`` does it, as on
  22.05.

Slurm's answers: error 2017 (invalid job id) and 2021 (already completing or
completed) mean the job is gone; 2020 (a job still launching, v0.0.42's status[])
is JobControlError, retried; 2010 / 2002 (user, access) are an operator's
to fix (JobControlError, permanent); an HTTP 400/405/415/422 says the request
itself is wrong (REFUSED: the job is left running and logged); slurmrestd
unreachable, 5xx or a refused token are JobControlError: the step is retried,
the notice delayed, never dropped.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

from adapters.base import DeliveryError, http_error
from adapters.schedulers.jobs import JobControlError, NoticeTerms, Outcome, RunningJob
from adapters.schedulers.slurm.client import SlurmClient
from adapters.schedulers.slurm.job_list import JobListError, convert, running_job, running_on
from adapters.schedulers.slurm.jobs import NOT_HERE, SignalScope, SlurmJobs
from adapters.schedulers.slurm.versions import slurm_errors

log = logging.getLogger(__name__)

SCOPE_FLAGS: dict[SignalScope, str] = {
    "full": "FULL_JOB",
    "batch": "BATCH_JOB",
    "steps": "FULL_STEPS_ONLY",
}
MAX_JOB_ID = 0x03FFFFFF  # slurm.h: the singular job path rejects ids from here on
GONE_ERRORS = {2017: "invalid job id", 2021: "already completing or completed"}
# v0.0.42 answers 200 with this in status[] while the job is still launching.
TRANSIENT_ERRORS = {2020: "the job cannot be altered now (still launching): try again"}
OPERATOR_ERRORS = {
    2002: "access denied: the token's user may not signal this job",
    2010: "the token's user is not a Slurm administrator (SlurmUser or AdminLevel)",
}


class SlurmRestJobs:
    """JobControl for Slurm: REST where the server offers it, the commands otherwise."""

    def __init__(
        self, client: SlurmClient, commands: SlurmJobs, *, scope: SignalScope = "full"
    ) -> None:
        self.name = "slurm"
        self._client = client
        self._commands = commands
        self._flags = SCOPE_FLAGS[scope]
        self._said: str | None = None  # the path last logged, to log a change once

    async def _version(self) -> str | None:
        try:
            version = await self._client.job_api()
        except DeliveryError as err:
            raise _job_error(err) from err
        path = f"REST ({version})" if version else "squeue / scancel"
        if path != self._said:
            log.info("slurm: running jobs are listed and signalled through %s", path)
            self._said = path
        return version

    async def _call(
        self,
        method: str,
        path: str,
        params: Mapping[str, str] | None = None,
        body: Mapping[str, Any] | None = None,
    ) -> tuple[int, Any]:
        try:
            return await self._client.call(method, path, params, body)
        except DeliveryError as err:
            raise _job_error(err) from err

    async def running(self, node: str) -> Sequence[RunningJob]:
        """The jobs RUNNING on ``node``, from the job list."""
        version = await self._version()
        if version is None:
            return await self._commands.running(node)
        status, body = await self._call("GET", f"/slurm/{version}/jobs/")
        if status != 200 or not isinstance(body, dict):
            raise _list_error("GET jobs", status, body)
        try:
            return running_on(convert(body), node)
        except JobListError as err:
            raise JobControlError(f"slurmrestd GET jobs: {err}", reason="malformed") from err

    async def _here(self, version: str, job: RunningJob) -> bool:
        """Whether ``job`` runs on the node it was listed on, now (one job, by id)."""
        if not job.node or not job.job_id.isdigit():
            return False  # never act on a job that cannot be checked against its node
        status, body = await self._call("GET", f"/slurm/{version}/job/{job.job_id}")
        if isinstance(body, dict) and set(GONE_ERRORS) & {n for n, _ in slurm_errors(body)}:
            return False
        if status != 200 or not isinstance(body, dict):
            raise _list_error(f"GET job {job.job_id}", status, body)
        try:
            listed = convert(body).jobs
            return any(
                (found := running_job(j, job.node)) is not None and found.job_id == job.job_id
                for j in listed
            )
        except JobListError as err:
            raise JobControlError(f"slurmrestd GET job {job.job_id}: {err}") from err

    async def notify(self, job: RunningJob, terms: NoticeTerms) -> tuple[Outcome, str]:
        """``DELETE /slurm/<v>/job/{job_id}?signal=SIG&flags=...``, once confirmed here."""
        version = await self._version()
        if version is None:
            return await self._commands.notify(job, terms)
        if not await self._here(version, job):
            return Outcome.GONE, NOT_HERE
        signal = terms.signal
        target = job.acted_on
        what = f"signal {signal} to job {target}"
        if _leading_id(target) >= MAX_JOB_ID and self._client.can_bulk_signal(version):
            kill = {"jobs": [target], "signal": signal, "flags": [self._flags]}
            status, body = await self._call("DELETE", f"/slurm/{version}/jobs/", body=kill)
            return _outcome(what, status, body)
        params = {"signal": signal, "flags": self._flags}
        status, body = await self._call("DELETE", f"/slurm/{version}/job/{target}", params)
        return _outcome(what, status, body)

    async def revise(self, job: RunningJob, terms: NoticeTerms | None) -> tuple[Outcome, str]:
        """Nothing, as with the commands: a signal carries no deadline and cannot be taken back."""
        return await self._commands.revise(job, terms)

    async def requeue(self, job: RunningJob) -> tuple[Outcome, str]:
        """``scontrol requeue JOB``: slurmrestd (up to v0.0.42) has no requeue."""
        version = await self._version()
        if version is None:
            return await self._commands.requeue(job)
        if not await self._here(version, job):
            return Outcome.GONE, NOT_HERE
        return await self._commands.send_requeue(job)


def _list_error(what: str, status: int, body: Any) -> JobControlError:
    errors = slurm_errors(body) if isinstance(body, dict) else []
    text = "; ".join(f"error {n}: {t}" for n, t in errors) or str(body)[:200]
    message = f"slurmrestd {what}: HTTP {status}: {text}"
    return _job_error(http_error(message, status) if status != 200 else DeliveryError(message))


def _job_error(err: DeliveryError) -> JobControlError:
    return JobControlError(str(err), permanent=err.permanent or err.final, reason=err.reason)


def _outcome(what: str, status: int, body: Any) -> tuple[Outcome, str]:
    errors = slurm_errors(body) if isinstance(body, dict) else []
    errors += _status_errors(body)
    if status == 200 and not errors:
        return Outcome.DONE, "ok"
    said = "; ".join(f"error {n}: {t}" for n, t in errors) or str(body)[:200]
    numbers = {n for n, _ in errors}
    if 0 in numbers:
        # Error 0 "No error": slurmrestd could not parse the request. For a signal name
        # it does not know, 24.11 (v0.0.41 on) answers 200 and sends SIGKILL (measured):
        # never count that as the notice given.
        return Outcome.REFUSED, f"HTTP {status}, request not understood: {said}"
    if numbers & GONE_ERRORS.keys():
        return Outcome.GONE, said
    known = sorted(numbers & OPERATOR_ERRORS.keys())
    if known:
        raise JobControlError(
            f"{what}: {said}: {OPERATOR_ERRORS[known[0]]}", permanent=True, reason="auth"
        )
    transient = sorted(numbers & TRANSIENT_ERRORS.keys())
    if transient:
        raise JobControlError(f"{what}: {said}: {TRANSIENT_ERRORS[transient[0]]}")
    if status == 200:
        # Accepted with errors Slurm did not number: it took the signal.
        return Outcome.DONE, said
    err = http_error(f"{what}: HTTP {status}: {said}", status)
    if err.final:
        return Outcome.REFUSED, f"HTTP {status}: {said}"
    raise JobControlError(str(err), permanent=err.permanent, reason=err.reason)


def _status_errors(body: Any) -> list[tuple[int, str]]:
    """Per-job errors of a kill response (``status[].error``: code, string, message)."""
    out = []
    items = body.get("status") if isinstance(body, dict) else None
    for item in items if isinstance(items, list) else []:
        e = item.get("error") if isinstance(item, dict) else None
        if isinstance(e, dict) and isinstance(e.get("code"), int) and e["code"] != 0:
            out.append((int(e["code"]), str(e.get("message") or e.get("string") or "")))
    return out


def _leading_id(job_id: str) -> int:
    """``"123_4"`` -> 123: the number a job reference starts with (0 if none)."""
    m = re.match(r"\d+", job_id)
    return int(m.group()) if m else 0
