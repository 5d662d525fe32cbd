"""Builds the scheduler sink from the config."""

from __future__ import annotations

from adapters.base import SchedulerSink
from adapters.schedulers.jobs import JobControl
from adapters.schedulers.kube_pods import POD_NOTICE, KubePods
from adapters.schedulers.kubernetes import KubeClient, KubeConnection, KubernetesSink, connection
from adapters.schedulers.slurm import SlurmSink
from adapters.schedulers.slurm_auth import JwtToken
from adapters.schedulers.slurm_jobs import SlurmJobs
from adapters.schedulers.slurm_rest_jobs import SlurmRestJobs
from adapters.schedulers.webhook import WebhookSink
from daemon.config.scheduler import (
    KubernetesSchedulerConfig,
    SchedulerConfig,
    SlurmSchedulerConfig,
)
from daemon.config.secrets import read_secret, resolve_secret
from daemon.delivery.notices import NoticeSettings


def build_sink(cfg: SchedulerConfig, lead_time_s: float) -> SchedulerSink:
    """The scheduler sink for the configured scheduler."""
    if isinstance(cfg, SlurmSchedulerConfig):
        token = None
        if cfg.token_file is not None:
            token = JwtToken(
                resolve_secret(cfg.token_file),
                refresh_command=cfg.token_refresh_command,
                refresh_before_s=cfg.token_refresh_before_s,
                timeout_s=cfg.timeout_s,
            )
        return SlurmSink(
            cfg.rest_url or None,
            token=token,
            user=cfg.user,
            auth=cfg.auth,
            api_version=cfg.api_version or None,
            write_via=cfg.write_via,
            scontrol=cfg.command(cfg.scontrol),
            slurm_conf=cfg.slurm_conf,
            timeout_s=cfg.timeout_s,
            exclude_state=cfg.exclude_state,
        )
    if isinstance(cfg, KubernetesSchedulerConfig):
        return KubernetesSink(
            _kube_connection(cfg),
            taint_key=cfg.taint_key,
            exclude_state=cfg.exclude_state,
            record_events=cfg.record_events,
            timeout_s=cfg.timeout_s,
        )
    return WebhookSink(
        cfg.url,
        read_secret(cfg.secret_file),
        timeout_s=cfg.timeout_s,
        grace_s=(cfg.grace_s(lead_time_s), cfg.critical_grace_s),
    )


def _kube_connection(cfg: KubernetesSchedulerConfig) -> KubeConnection:
    return connection(
        api_url=cfg.api_url,
        token_file=resolve_secret(cfg.token_file) if cfg.token_file else None,
        ca_file=cfg.ca_file,
        kubeconfig=cfg.kubeconfig,
        insecure_skip_tls_verify=cfg.insecure_skip_tls_verify,
    )


def build_job_notices(
    cfg: SchedulerConfig | None, lead_time_s: float, sink: SchedulerSink | None = None
) -> tuple[JobControl, NoticeSettings] | None:
    """What tells a node's running jobs of a drain, and how; None where the scheduler has none.

    Raises KubeAuthError when the Kubernetes connection cannot be resolved.
    Slurm with a REST URL: through slurmrestd where it can (>= 23.02, the sink's
    session and token), the commands otherwise.
    """
    if isinstance(cfg, SlurmSchedulerConfig):
        commands = SlurmJobs(
            squeue=cfg.command(cfg.squeue),
            scancel=cfg.command(cfg.scancel),
            scontrol=cfg.command(cfg.scontrol),
            scope=cfg.notice_scope,
            slurm_conf=cfg.slurm_conf,
            timeout_s=cfg.timeout_s,
        )
        jobs: JobControl = commands
        if cfg.rest_url and isinstance(sink, SlurmSink):
            jobs = SlurmRestJobs(sink, commands, scope=cfg.notice_scope)
        signal, requeue = cfg.notice_signal, cfg.requeue
    elif isinstance(cfg, KubernetesSchedulerConfig):
        client = KubeClient(_kube_connection(cfg), timeout_s=cfg.timeout_s)
        jobs = KubePods(client, record_events=cfg.record_events)
        signal, requeue = POD_NOTICE, cfg.evicts
    else:
        return None
    settings = NoticeSettings(
        signal=signal,
        checkpoint_grace_s=cfg.grace_s(lead_time_s),
        critical_grace_s=cfg.critical_grace_s,
        requeue=requeue,
        retry_initial_s=cfg.retry_initial_s,
        retry_max_s=cfg.retry_max_s,
    )
    return jobs, settings
