"""Builds the scheduler sink from the config."""

from __future__ import annotations

from adapters.base import SchedulerSink
from adapters.schedulers.kubernetes import KubernetesSink, connection
from adapters.schedulers.slurm import SlurmSink
from adapters.schedulers.slurm_auth import JwtToken
from adapters.schedulers.webhook import WebhookSink
from daemon.config.scheduler import (
    KubernetesSchedulerConfig,
    SchedulerConfig,
    SlurmSchedulerConfig,
)
from daemon.config.secrets import read_secret, resolve_secret


def build_sink(cfg: SchedulerConfig) -> SchedulerSink:
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
            scontrol=cfg.scontrol,
            slurm_conf=cfg.slurm_conf,
            timeout_s=cfg.timeout_s,
        )
    if isinstance(cfg, KubernetesSchedulerConfig):
        conn = connection(
            api_url=cfg.api_url,
            token_file=resolve_secret(cfg.token_file) if cfg.token_file else None,
            ca_file=cfg.ca_file,
            kubeconfig=cfg.kubeconfig,
            insecure_skip_tls_verify=cfg.insecure_skip_tls_verify,
        )
        return KubernetesSink(
            conn,
            taint_key=cfg.taint_key,
            evict_on_drain=cfg.evict_on_drain,
            record_events=cfg.record_events,
            timeout_s=cfg.timeout_s,
        )
    return WebhookSink(cfg.url, read_secret(cfg.secret_file), timeout_s=cfg.timeout_s)
