"""The [scheduler] table: where decisions go, and how they are kept until confirmed."""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from adapters.schedulers.backend import Backend
from adapters.schedulers.base import EXCLUDE_STATE_DEFAULT, ExcludeState
from adapters.schedulers.kubernetes.backend import KubernetesBackend
from adapters.schedulers.kubernetes.client import KubeClient, connection
from adapters.schedulers.slurm.auth import JwtToken
from adapters.schedulers.slurm.backend import SlurmBackend
from adapters.schedulers.slurm.client import SlurmClient
from adapters.schedulers.webhook.backend import WebhookBackend
from adapters.schedulers.webhook.sink import WebhookSink
from daemon.config.outbox_path import location_problem, outbox_location
from daemon.config.secrets import read_secret, resolve_secret, secret_problem
from daemon.config.typed_toml import Problems, bounded

_TAINT_KEY = re.compile(r"^([a-z0-9.-]+/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def _url_problem(url: str) -> str | None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"must be an http:// or https:// URL, got {url!r}"
    return None


NO_NODE_SETTING = (
    "steering needs [scheduler] type 'slurm' (node Weight) or 'kubernetes'"
    " (node label); set enabled = false"
)

# A notice must leave the job able to checkpoint: never one that ends or stops it.
_NOT_A_NOTICE = {"KILL", "STOP", "TERM", "INT", "QUIT", "ABRT", "SEGV", "BUS", "FPE", "ILL"}
# The signal names Slurm parses (scancel, slurmrestd; measured on 24.11). For any other,
# slurmrestd 24.11 answers 200 and sends the job SIGKILL (v0.0.41/42): never send one.
SLURM_SIGNALS = frozenset(
    {"ALRM", "CHLD", "CONT", "HUP", "PIPE", "TSTP", "TTIN", "TTOU", "URG", "USR1", "USR2"}
    | {"XCPU", "ABRT", "INT", "KILL", "QUIT", "STOP", "TERM"}
)


def signal_problem(name: str) -> str | None:
    """Why ``name`` is not a usable notice signal ("USR1", "URG", ...), or None."""
    if not name:
        return None
    known = {s.name.removeprefix("SIG") for s in signal.Signals if not s.name.startswith("SIG_")}
    if name not in known:
        names = ", ".join(sorted(known))
        return f"must be a signal name without SIG, e.g. 'USR1' (one of: {names}), got {name!r}"
    if name in _NOT_A_NOTICE:
        return f"{name!r} ends or stops the job; a notice must let it checkpoint (e.g. 'USR1')"
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class DeliverySettings:
    """Keys every scheduler type shares: the outbox, retries and reconciliation."""

    # The SQLite outbox (decisions, overrides, audit trail): decisions are
    # written here before they are sent and survive restarts. Unset:
    # outbox.sqlite3 in $STATE_DIRECTORY (systemd's StateDirectory=), else in
    # /var/lib/rackguard. ":memory:" keeps it in memory only (lost on restart:
    # the demo and tests ask for that explicitly).
    outbox_path: Path | None = None
    retry_initial_s: float = bounded(1.0, gt=0)
    retry_max_s: float = bounded(60.0, gt=0)
    # A decision still undelivered this long after it was made (wall seconds) makes
    # /readyz not ready, naming it, and sets rackguard_delivery_undeliverable.
    undeliverable_after_s: float = bounded(120.0, gt=0)
    # Read the scheduler's view of our nodes this often and converge it to the
    # intended state (sinks that can read nodes: slurm, kubernetes). 0: never.
    reconcile_interval_s: float = bounded(60.0, ge=0)

    def delivery_problems(self) -> Problems:
        """Retry bounds and the outbox's directory."""
        if self.retry_max_s < self.retry_initial_s:
            yield "retry_max_s", f"must be at least retry_initial_s ({self.retry_initial_s})"
        # A missing directory is fine: the outbox creates it (or systemd's StateDirectory=).
        problem = location_problem(outbox_location(self.outbox_path))
        if problem:
            unset = " (not set; the default)" if self.outbox_path is None else ""
            yield "outbox_path", f"{problem}{unset}"


@dataclass(frozen=True, slots=True, kw_only=True)
class NoticeGraceSettings(DeliverySettings):
    """How long the running work of a drained or excluded node gets: the notice's deadline."""

    # Seconds between a drain and the requeue / eviction of the work still running.
    # 0: policy.lead_time_s less checkpoint_margin_s.
    checkpoint_grace_s: float = bounded(0.0, ge=0)
    checkpoint_margin_s: float = bounded(60.0, ge=0)
    # The same after an exclusion (a critical reading: little time left).
    critical_grace_s: float = bounded(20.0, ge=0, le=600)

    def grace_s(self, lead_time_s: float) -> float:
        """The drain's grace: checkpoint_grace_s, or the lead time less the margin."""
        if self.checkpoint_grace_s > 0:
            return self.checkpoint_grace_s
        return max(lead_time_s - self.checkpoint_margin_s, self.critical_grace_s)

    def cross_problems(self, *, lead_time_s: float, steering: bool) -> Problems:
        """Checks against the rest of the config (keys named from the top): by default,
        a scheduler without a node setting cannot be steered."""
        if steering:
            yield "steering.enabled", NO_NODE_SETTING


@dataclass(frozen=True, slots=True, kw_only=True)
class WebhookSchedulerConfig(NoticeGraceSettings):
    """Decisions POSTed as signed JSON to an HTTP endpoint."""

    type: Literal["webhook"]
    url: str
    # HMAC-SHA256 key; the file's contents, never the key itself, live in config.
    secret_file: Path
    timeout_s: float = bounded(5.0, gt=0, le=120)

    def validate(self) -> Problems:
        """URL shape, secret readability, retry bounds."""
        problem = _url_problem(self.url)
        if problem:
            yield "url", problem
        problem = secret_problem(resolve_secret(self.secret_file))
        if problem:
            yield "secret_file", problem
        yield from self.delivery_problems()

    def backend(self, lead_time_s: float) -> Backend:
        """The signed POST, its secret read now."""
        sink = WebhookSink(
            self.url,
            read_secret(self.secret_file),
            timeout_s=self.timeout_s,
            grace_s=(self.grace_s(lead_time_s), self.critical_grace_s),
        )
        return WebhookBackend(sink)


@dataclass(frozen=True, slots=True, kw_only=True)
class SlurmSchedulerConfig(NoticeGraceSettings):
    """Slurm through slurmrestd (JWT), writing through scontrol where REST cannot."""

    type: Literal["slurm"]
    # e.g. "http://127.0.0.1:6820". Empty: read and write through scontrol only.
    rest_url: str = ""
    # The user the token belongs to (X-SLURM-USER-NAME); it must be a Slurm administrator.
    user: str = "root"
    # A file holding the JWT (or "SLURM_JWT=<token>"); required with rest_url.
    token_file: Path | None = None
    # Run to get a fresh token before the current one expires and after a 401/511;
    # it prints the token (e.g. ["scontrol", "token", "lifespan=3600"]) or rewrites token_file.
    token_refresh_command: tuple[str, ...] = ()
    token_refresh_before_s: float = bounded(300.0, ge=0)
    # "x-slurm": X-SLURM-USER-NAME/-TOKEN headers; "bearer": Authorization: Bearer.
    auth: Literal["x-slurm", "bearer"] = "x-slurm"
    # e.g. "v0.0.40". Empty: the newest the server offers.
    api_version: str = ""
    # auto: REST where the server can update nodes (Slurm >= 23.02), else scontrol.
    write_via: Literal["auto", "rest", "scontrol"] = "auto"
    scontrol: tuple[str, ...] = ("scontrol",)
    # SLURM_CONF for scontrol; unset: scontrol's own default.
    slurm_conf: Path | None = None
    timeout_s: float = bounded(10.0, gt=0, le=120)
    # What an exclusion sets: "drain" (running jobs are told, then requeued after
    # critical_grace_s) or "down" (Slurm kills the node's running jobs at once).
    exclude_state: ExcludeState = EXCLUDE_STATE_DEFAULT
    # Once a drain or exclusion is applied, each job running on the node gets this
    # signal (a name as `scancel --signal` takes it: "USR1"); "" sends none (jobs
    # can still read GET /v1/node/notice).
    notice_signal: str = "USR1"
    # full: the batch shell, its children and every step (scancel --full);
    # batch: the batch shell only (--batch); steps: the steps only.
    notice_scope: Literal["full", "batch", "steps"] = "full"
    # Requeue jobs still running at the deadline (a job submitted with
    # --no-requeue is left running, and logged). false: tell them only.
    requeue: bool = True
    squeue: tuple[str, ...] = ("squeue",)
    scancel: tuple[str, ...] = ("scancel",)
    # Put before scontrol, squeue and scancel (not before token_refresh_command): a
    # site's wrapper, or ["chroot", "/srv/slurm"] where the Slurm client tools that
    # match the controller live in another root. slurm_conf is then a path in there.
    command_prefix: tuple[str, ...] = ()

    def command(self, argv: tuple[str, ...]) -> tuple[str, ...]:
        """A Slurm command (``scontrol``, ``squeue``, ``scancel``) with the prefix."""
        return (*self.command_prefix, *argv)

    def validate(self) -> Problems:
        """URL, token file, write path, version spelling, the notice's signal."""
        if self.rest_url:
            problem = _url_problem(self.rest_url)
            if problem:
                yield "rest_url", problem
            if self.token_file is None:
                yield "token_file", "required with rest_url (slurmrestd wants a JWT)"
            elif not self.token_refresh_command:
                problem = secret_problem(resolve_secret(self.token_file))
                if problem:
                    yield "token_file", problem
        elif self.write_via == "rest":
            yield "write_via", "'rest' needs rest_url"
        if self.api_version and not re.fullmatch(r"v\d+\.\d+\.\d+", self.api_version):
            yield "api_version", f"must look like 'v0.0.40', got {self.api_version!r}"
        for key in ("scontrol", "squeue", "scancel"):
            if not getattr(self, key):
                yield key, f"must name the {key} command"
        yield from _prefix_problems(self.command_prefix)
        problem = signal_problem(self.notice_signal)
        if problem:
            yield "notice_signal", problem
        elif self.notice_signal and self.notice_signal not in SLURM_SIGNALS:
            usable = ", ".join(sorted(SLURM_SIGNALS - _NOT_A_NOTICE))
            yield (
                "notice_signal",
                (
                    f"Slurm does not know the signal {self.notice_signal!r} (slurmrestd would "
                    f"kill the job instead); one of: {usable}"
                ),
            )
        yield from self.delivery_problems()

    def cross_problems(self, *, lead_time_s: float, steering: bool) -> Problems:
        """The jobs' grace must end before the forecast trouble arrives."""
        if self.checkpoint_grace_s >= lead_time_s:
            yield (
                "scheduler.checkpoint_grace_s",
                f"must be below policy.lead_time_s ({lead_time_s:g}): the jobs "
                "must be requeued before the forecast trouble arrives",
            )

    def backend(self, lead_time_s: float) -> Backend:
        """One client (slurmrestd where rest_url is set, and the commands) for everything."""
        token = None
        if self.token_file is not None:
            token = JwtToken(
                resolve_secret(self.token_file),
                refresh_command=self.token_refresh_command,
                refresh_before_s=self.token_refresh_before_s,
                timeout_s=self.timeout_s,
            )
        client = SlurmClient(
            self.rest_url or None,
            token=token,
            user=self.user,
            auth=self.auth,
            api_version=self.api_version or None,
            write_via=self.write_via,
            scontrol=self.command(self.scontrol),
            slurm_conf=self.slurm_conf,
            timeout_s=self.timeout_s,
        )
        return SlurmBackend(
            client,
            exclude_state=self.exclude_state,
            squeue=self.command(self.squeue),
            scancel=self.command(self.scancel),
            notice_scope=self.notice_scope,
            notice_signal=self.notice_signal,
            requeue=self.requeue,
        )


def _prefix_problems(prefix: tuple[str, ...]) -> Problems:
    """An empty word, or a chroot without an existing directory to run in."""
    for i, word in enumerate(prefix):
        if not word.strip():
            yield "command_prefix", f"word {i} is empty"
            return
    if prefix and Path(prefix[0]).name == "chroot":
        where = next((w for w in prefix[1:] if not w.startswith("-")), None)
        if where is None:
            yield (
                "command_prefix",
                "chroot needs the directory to run in, e.g. ['chroot', '/srv/slurm']",
            )
        elif not Path(where).is_dir():
            yield "command_prefix", f"chroot directory {where!r} does not exist"


@dataclass(frozen=True, slots=True, kw_only=True)
class KubernetesSchedulerConfig(NoticeGraceSettings):
    """Kubernetes: cordon and taint the node; tell its pods, evict them after the grace."""

    type: Literal["kubernetes"]
    # e.g. "https://10.0.0.1:6443". Empty: in-cluster (KUBERNETES_SERVICE_HOST/PORT)
    # or the kubeconfig's current context.
    api_url: str = ""
    # Service-account token; empty with api_url empty: the in-cluster account's.
    token_file: Path | None = None
    ca_file: Path | None = None
    # A kubeconfig (token users only): server, CA and token of its current context.
    kubeconfig: Path | None = None
    insecure_skip_tls_verify: bool = False
    taint_key: str = "rackguard.io/thermal"
    # What an exclusion sets: "drain" (a NoSchedule taint: the pods are told, then
    # evicted after critical_grace_s) or "down" (NoExecute: evicted at once, no grace).
    exclude_state: ExcludeState = EXCLUDE_STATE_DEFAULT
    # Evict the pods still on the node at the notice's deadline (Eviction API,
    # honours PodDisruptionBudgets). false: annotate and tell them only.
    evict: bool = True
    # The former name of `evict`; when set, it wins (false: no eviction).
    evict_on_drain: bool | None = None
    # Record each change as a Kubernetes Event on the node too (the annotation is always set).
    record_events: bool = True
    timeout_s: float = bounded(10.0, gt=0, le=120)

    @property
    def evicts(self) -> bool:
        """Whether pods still on the node at the deadline are evicted."""
        return self.evict if self.evict_on_drain is None else self.evict_on_drain

    def validate(self) -> Problems:
        """URL, credentials and the taint key's spelling."""
        if self.api_url:
            problem = _url_problem(self.api_url)
            if problem:
                yield "api_url", problem
        if self.kubeconfig is not None and (self.api_url or self.token_file):
            yield "kubeconfig", "give either kubeconfig or api_url/token_file, not both"
        if self.kubeconfig is not None and not self.kubeconfig.is_file():
            yield "kubeconfig", f"file {str(self.kubeconfig)!r} does not exist"
        if self.token_file is not None:
            problem = secret_problem(resolve_secret(self.token_file))
            if problem:
                yield "token_file", problem
        if self.api_url and self.token_file is None:
            yield "token_file", "required with api_url (the service account's token)"
        if self.ca_file is not None and not self.ca_file.is_file():
            yield "ca_file", f"file {str(self.ca_file)!r} does not exist"
        # Neither api_url nor kubeconfig means the in-cluster service account; that
        # is checked at start (it depends on the environment, not on this file).
        if not _TAINT_KEY.match(self.taint_key):
            yield "taint_key", f"not a valid taint key: {self.taint_key!r}"
        yield from self.delivery_problems()

    def cross_problems(self, *, lead_time_s: float, steering: bool) -> Problems:
        """None: steering writes a node label."""
        yield from ()

    def backend(self, lead_time_s: float) -> Backend:
        """One API client for everything; KubeAuthError when it cannot be resolved."""
        conn = connection(
            api_url=self.api_url,
            token_file=resolve_secret(self.token_file) if self.token_file else None,
            ca_file=self.ca_file,
            kubeconfig=self.kubeconfig,
            insecure_skip_tls_verify=self.insecure_skip_tls_verify,
        )
        return KubernetesBackend(
            KubeClient(conn, timeout_s=self.timeout_s),
            taint_key=self.taint_key,
            exclude_state=self.exclude_state,
            record_events=self.record_events,
            evict=self.evicts,
        )


# The scheduler backends by name: one arm per `type` (the key picks the arm when the
# config is read; the arm's backend() builds adapters/schedulers/<type>/). A new
# scheduler is its package there, its config class here and one arm.
SchedulerConfig = WebhookSchedulerConfig | SlurmSchedulerConfig | KubernetesSchedulerConfig
