"""Builds the scheduler backend from the config, and the job notices it offers."""

from __future__ import annotations

from adapters.schedulers.backend import Backend
from adapters.schedulers.jobs import JobControl
from daemon.config.scheduler import SchedulerConfig
from daemon.delivery.notices import NoticeSettings


def build_backend(cfg: SchedulerConfig, lead_time_s: float) -> Backend:
    """The configured scheduler's backend (its ``type`` picked the config class).

    Raises KubeAuthError when the Kubernetes connection cannot be resolved.
    """
    return cfg.backend(lead_time_s)


def build_job_notices(
    cfg: SchedulerConfig | None, lead_time_s: float, backend: Backend | None
) -> tuple[JobControl, NoticeSettings] | None:
    """What tells a node's running jobs of a drain, and how; None where the scheduler has none.

    Slurm with a REST URL: through slurmrestd where it can (>= 23.02, the
    backend's one session and token), the commands otherwise.
    """
    handling = backend.job_control() if backend is not None else None
    if cfg is None or handling is None:
        return None
    settings = NoticeSettings(
        signal=handling.signal,
        checkpoint_grace_s=cfg.grace_s(lead_time_s),
        critical_grace_s=cfg.critical_grace_s,
        requeue=handling.requeue,
        retry_initial_s=cfg.retry_initial_s,
        retry_max_s=cfg.retry_max_s,
    )
    return handling.control, settings
