"""Slurm as a backend: one SlurmClient (slurmrestd and the commands) under every capability."""

from __future__ import annotations

from collections.abc import Sequence

from adapters.schedulers.base import EXCLUDE_STATE_DEFAULT, ExcludeState
from adapters.schedulers.jobs import JobControl, JobHandling
from adapters.schedulers.slurm.client import SlurmClient
from adapters.schedulers.slurm.jobs import SignalScope, SlurmJobs
from adapters.schedulers.slurm.rest_jobs import SlurmRestJobs
from adapters.schedulers.slurm.sink import SlurmSink
from adapters.schedulers.slurm.weight import SlurmWeight


class SlurmBackend:
    """Drain, list, job notices (REST where the server can, the commands otherwise), Weight."""

    name = "slurm"

    def __init__(
        self,
        client: SlurmClient,
        *,
        exclude_state: ExcludeState = EXCLUDE_STATE_DEFAULT,
        squeue: Sequence[str] = ("squeue",),
        scancel: Sequence[str] = ("scancel",),
        notice_scope: SignalScope = "full",
        notice_signal: str = "USR1",
        requeue: bool = True,
    ) -> None:
        self.client = client
        self._sink = SlurmSink(client, exclude_state=exclude_state)
        commands = SlurmJobs(client, squeue=squeue, scancel=scancel, scope=notice_scope)
        jobs: JobControl = commands
        if client.rest:
            jobs = SlurmRestJobs(client, commands, scope=notice_scope)
        self._jobs = JobHandling(jobs, notice_signal, requeue)
        self._weight = SlurmWeight(client)

    def sink(self) -> SlurmSink:
        """Node drains, exclusions and resumes; node reads."""
        return self._sink

    def lister(self) -> SlurmSink:
        """``GET /nodes`` or ``scontrol -o show nodes``."""
        return self._sink

    def job_control(self) -> JobHandling:
        """A signal to each job, ``scontrol requeue`` at the deadline."""
        return self._jobs

    def node_setting(self, label_key: str) -> SlurmWeight:
        """The node's Weight (``label_key`` is Kubernetes')."""
        return self._weight
