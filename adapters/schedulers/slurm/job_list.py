"""Slurm's job list as structured data: the jobs running on one node, by the ids Slurm acts on.

Both ``squeue --json`` and slurmrestd's ``GET /slurm/<v>/jobs/`` answer ``{"jobs":
[...]}``; one typed model reads either. Numbers come bare (22.05, v0.0.38) or as
``{"set": true, "number": N}`` (v0.0.40 on), and ``job_state`` as a string or a
list of flags.

A job's name, comment and user text are written by the user who submitted it:
they are carried as JSON strings, never split on, and used only to be shown
(control characters escaped, cut to a length). Identity comes from numbers and
the node list alone:

- ``job_id`` is the job's identity, checked against the node: every array task
  and every heterogeneous-job component has its own (``3_0`` is job 5, ``6+1``
  job 7).
- What a signal or a requeue names (``target``) is another id where Slurm says
  so (measured on 22.05 and 24.11): a heterogeneous job is reached through its
  leader (a signal to another component's id reaches no batch shell, and
  ``scontrol requeue`` of a component answers "Job not heterogeneous job
  leader"); an array task is named ``ARRAY_TASK``, since the task that runs
  under the array's own id would, by that id, name every task of the array on
  every node. Two components of one hetjob on the node are one job to act on.

A list that cannot be read whole (not JSON, not this shape, a job without an
id, a node list that is not a hostlist) raises :class:`JobListError`: a job that
cannot be placed might be on this node, so nothing is concluded from the rest.
"""

from __future__ import annotations

from typing import Any

import msgspec

from adapters.schedulers.jobs import RunningJob
from adapters.schedulers.slurm.hostlist import HostlistError, hostlist_has

SHOWN_LIMIT = 200  # characters of a user-written field kept for logs and the API


class JobListError(ValueError):
    """The job list could not be read whole."""


class _Number(msgspec.Struct):
    """v0.0.40+'s optional number."""

    set: bool = True
    infinite: bool = False
    number: int = 0


_Num = int | _Number | None


class SlurmJob(msgspec.Struct):
    """The fields of one job that rackguard reads; the rest are ignored."""

    job_id: _Num
    job_state: str | list[str] | None = None
    nodes: str | None = None
    name: str | None = None
    user_name: str | None = None
    array_job_id: _Num = None
    array_task_id: _Num = None
    het_job_id: _Num = None
    het_job_offset: _Num = None


class SlurmJobList(msgspec.Struct):
    """``{"jobs": [...]}``, the rest ignored."""

    jobs: list[SlurmJob]


def number(value: _Num) -> int | None:
    """A set, finite, non-negative number; None otherwise."""
    if isinstance(value, _Number):
        if not value.set or value.infinite:
            return None
        value = value.number
    if value is None or value < 0:
        return None
    return value


def states(job: SlurmJob) -> set[str]:
    """The job's state flags, upper case."""
    raw = job.job_state
    items = [raw] if isinstance(raw, str) else raw or []
    return {s.upper() for s in items}


def shown(text: str | None) -> str:
    """A user-written field made safe to show: control characters escaped, length capped."""
    text = text or ""
    safe = "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text[: SHOWN_LIMIT * 2])
    return safe[:SHOWN_LIMIT]


def decode_json(text: str | bytes) -> SlurmJobList:
    """``squeue --json`` output; JobListError when it is not a whole job list."""
    try:
        return msgspec.json.decode(text, type=SlurmJobList)
    except msgspec.ValidationError as err:
        raise JobListError(f"not a Slurm job list: {err}") from err
    except msgspec.DecodeError as err:
        raise JobListError(f"not JSON: {err}") from err


def convert(body: Any) -> SlurmJobList:
    """A parsed REST body; JobListError when it is not a whole job list."""
    try:
        return msgspec.convert(body, SlurmJobList)
    except msgspec.ValidationError as err:
        raise JobListError(f"not a Slurm job list: {err}") from err


def running_job(job: SlurmJob, node: str) -> RunningJob | None:
    """``job`` as a RunningJob when it is RUNNING on ``node`` now; None when it is not.

    Raises JobListError for a job that cannot be placed (no id, a bad node list).
    """
    job_id = number(job.job_id)
    if job_id is None or job_id == 0:
        raise JobListError(f"a job without an id: {shown(repr(job.job_id))}")
    if "RUNNING" not in states(job):
        return None
    try:
        here = hostlist_has(job.nodes or "", node)
    except HostlistError as err:
        raise JobListError(f"job {job_id}: {err}") from err
    if not here:
        return None
    label = target = str(job_id)
    het, offset = number(job.het_job_id), number(job.het_job_offset)
    array, task = number(job.array_job_id), number(job.array_task_id)
    if het:  # 22.05 says 0 for "not heterogeneous"
        label, target = f"{het}+{offset or 0}", str(het)
    elif array and task is not None:
        label = target = f"{array}_{task}"
    return RunningJob(
        str(job_id),
        shown(job.name),
        shown(job.user_name),
        node=node,
        label=label,
        target=target,
    )


def running_on(jobs: SlurmJobList, node: str) -> list[RunningJob]:
    """Every job RUNNING on ``node``; JobListError when one cannot be placed."""
    out: dict[str, RunningJob] = {}
    for job in jobs.jobs:
        found = running_job(job, node)
        if found is not None:
            out.setdefault(found.acted_on, found)
    return list(out.values())
