"""rackguard's configuration: one TOML file, validated into frozen typed objects at start.

Every key is documented in systemd/rackguard.example.toml, which a test loads.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from daemon.typed_toml import ConfigError, bounded, load_typed

__all__ = [
    "ApiConfig",
    "Config",
    "ConfigError",
    "LoggingConfig",
    "NodeConfig",
    "NvmlSourceConfig",
    "PolicyConfig",
    "SourceConfig",
    "WebhookSchedulerConfig",
    "load_config",
    "parse_config",
    "read_secret",
]

Problems = Iterator[tuple[str, str]]


def _secret_problem(path: Path) -> str | None:
    try:
        with path.open("rb") as fh:
            if not fh.read(4096).strip():
                return f"secret file {str(path)!r} is empty"
    except OSError as err:
        return f"secret file {str(path)!r} cannot be read: {err.strerror or err}"
    return None


def read_secret(path: Path) -> bytes:
    """The secret's bytes with surrounding whitespace removed (files usually end in a newline).

    Under systemd, a bare file name is looked up in $CREDENTIALS_DIRECTORY
    (LoadCredential=), so the unit and the config can name the same credential.
    """
    return _resolve_secret(path).read_bytes().strip()


def _resolve_secret(path: Path) -> Path:
    creds = os.environ.get("CREDENTIALS_DIRECTORY")
    if creds and not path.is_absolute() and len(path.parts) == 1:
        return Path(creds) / path
    return path


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """Who this agent speaks for."""

    name: str
    rack: str = "rack-1"

    def validate(self) -> Problems:
        """Names must be usable as scheduler node names."""
        if not self.name.strip() or any(c.isspace() for c in self.name):
            yield "name", f"must be a node name without spaces, got {self.name!r}"


@dataclass(frozen=True, slots=True)
class LoggingConfig:
    """Where and how much to log."""

    level: Literal["debug", "info", "warning", "error"] = "info"
    # auto: journald style (no timestamps, syslog priority prefixes) when
    # systemd's JOURNAL_STREAM is set, plain text with timestamps otherwise.
    format: Literal["auto", "text", "journald"] = "auto"


@dataclass(frozen=True, slots=True)
class ApiConfig:
    """The HTTP API for schedulers and operators."""

    listen: str = "127.0.0.1"
    port: int = bounded(9470, ge=0, le=65535)


@dataclass(frozen=True, slots=True)
class SourceTiming:
    """Scheduling shared by every source; see daemon/runner.py."""

    interval_s: float
    timeout_s: float
    backoff_initial_s: float
    backoff_max_s: float
    down_after: int


@dataclass(frozen=True, slots=True)
class NvmlSourceConfig:
    """The node's GPUs through NVML."""

    type: Literal["nvml"]
    interval_s: float = bounded(1.0, gt=0, le=3600)
    timeout_s: float = bounded(0.5, gt=0)
    backoff_initial_s: float = bounded(1.0, gt=0)
    backoff_max_s: float = bounded(60.0, gt=0)
    down_after: int = bounded(3, ge=1)
    # Python module that provides the NVML API (nvidia-ml-py's "pynvml").
    binding: str = "pynvml"
    # GPU indices to poll; empty means every GPU NVML reports.
    gpus: list[int] = field(default_factory=list)

    @property
    def timing(self) -> SourceTiming:
        """The runner's view of this source."""
        return SourceTiming(
            self.interval_s,
            self.timeout_s,
            self.backoff_initial_s,
            self.backoff_max_s,
            self.down_after,
        )

    def validate(self) -> Problems:
        """Cross-field checks."""
        if self.timeout_s >= self.interval_s:
            yield (
                "timeout_s",
                f"must be less than interval_s ({self.interval_s}), got {self.timeout_s}",
            )
        if self.backoff_max_s < self.backoff_initial_s:
            yield (
                "backoff_max_s",
                f"must be at least backoff_initial_s ({self.backoff_initial_s}), "
                f"got {self.backoff_max_s}",
            )
        for i, gpu in enumerate(self.gpus):
            if gpu < 0:
                yield f"gpus[{i}]", f"must be a GPU index (>= 0), got {gpu}"


SourceConfig = NvmlSourceConfig


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """The threshold rule with hysteresis: margins are slowdown temperature minus temperature."""

    # Drain when a GPU's thermal margin falls to this many degrees or less.
    enter_margin_c: float = bounded(5.0, ge=0, le=50)
    # A drained node becomes healthy again once every margin is at least this.
    exit_margin_c: float = bounded(10.0, ge=0, le=60)
    # Exclude at once when a margin falls to this (0: at the slowdown temperature).
    critical_margin_c: float = bounded(0.0, ge=-10, le=50)
    # Least time between a drain or exclusion and the resume that ends it.
    min_dwell_s: float = bounded(60.0, ge=0)
    # How long a node must stay healthy before it is resumed.
    resume_after_s: float = bounded(300.0, ge=0)
    # A reading older than this is stale: the GPU is UNKNOWN, never "all clear".
    stale_after_s: float = bounded(5.0, gt=0)
    # How often the policy runs over the latest readings.
    evaluate_interval_s: float = bounded(1.0, gt=0, le=60)
    # Decide and report, but send nothing to the scheduler.
    dry_run: bool = False

    def validate(self) -> Problems:
        """Hysteresis must open the right way."""
        if self.exit_margin_c <= self.enter_margin_c:
            yield (
                "exit_margin_c",
                f"exit threshold must be above enter_margin_c ({self.enter_margin_c}) "
                f"so the node leaves the drain on the healthy side, got {self.exit_margin_c}",
            )
        if self.critical_margin_c >= self.enter_margin_c:
            yield (
                "critical_margin_c",
                f"must be below enter_margin_c ({self.enter_margin_c}), "
                f"got {self.critical_margin_c}",
            )


@dataclass(frozen=True, slots=True)
class WebhookSchedulerConfig:
    """Decisions POSTed as signed JSON to an HTTP endpoint."""

    type: Literal["webhook"]
    url: str
    # HMAC-SHA256 key; the file's contents, never the key itself, live in config.
    secret_file: Path
    timeout_s: float = bounded(5.0, gt=0, le=120)
    retry_initial_s: float = bounded(1.0, gt=0)
    retry_max_s: float = bounded(60.0, gt=0)

    def validate(self) -> Problems:
        """URL shape, secret readability, retry bounds."""
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            yield "url", f"must be an http:// or https:// URL, got {self.url!r}"
        problem = _secret_problem(_resolve_secret(self.secret_file))
        if problem:
            yield "secret_file", problem
        if self.retry_max_s < self.retry_initial_s:
            yield "retry_max_s", f"must be at least retry_initial_s ({self.retry_initial_s})"


SchedulerConfig = WebhookSchedulerConfig


@dataclass(frozen=True, slots=True)
class Config:
    """The whole configuration."""

    node: NodeConfig
    sources: dict[str, SourceConfig]
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    api: ApiConfig = field(default_factory=ApiConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    scheduler: SchedulerConfig | None = None

    def validate(self) -> Problems:
        """At least one source, with names usable in logs and metrics."""
        if not self.sources:
            yield "sources", "at least one source is required"
        for name in self.sources:
            if not name.replace("-", "_").isidentifier():
                yield f"sources.{name}", "source names may hold letters, digits, '-' and '_'"


def parse_config(text: str, *, origin: str = "<config>") -> Config:
    """Parse and validate TOML text."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError([f"{origin}: not valid TOML: {err}"]) from err
    return load_typed(Config, data)


def load_config(path: Path) -> Config:
    """Read, parse and validate a config file."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError([f"{path}: cannot read config: {err.strerror or err}"]) from err
    return parse_config(text, origin=str(path))
