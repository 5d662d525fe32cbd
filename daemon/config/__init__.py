"""rackguard's configuration: one TOML file, validated into frozen typed objects at start.

Every key is documented in daemon/deploy/rackguard.example.toml, which a test loads.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from daemon.config.cluster import ClusterConfig
from daemon.config.opcua import OpcuaSourceConfig
from daemon.config.policy import PolicyConfig
from daemon.config.scheduler import SchedulerConfig, WebhookSchedulerConfig
from daemon.config.secrets import read_secret, resolve_secret, secret_problem
from daemon.config.snmp import SnmpSourceConfig
from daemon.config.sources import NvmlSourceConfig
from daemon.config.typed_toml import ConfigError, Problems, bounded, load_typed

# One arm per source type (the `type` key picks it); add new types here.
SourceConfig = NvmlSourceConfig | SnmpSourceConfig | OpcuaSourceConfig

__all__ = [
    "ApiConfig",
    "Config",
    "ConfigError",
    "LoggingConfig",
    "NodeConfig",
    "NvmlSourceConfig",
    "OpcuaSourceConfig",
    "PolicyConfig",
    "SnmpSourceConfig",
    "SourceConfig",
    "WebhookSchedulerConfig",
    "load_config",
    "parse_config",
    "read_secret",
]


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
    # Bearer token for POST /v1/overrides; unset disables the mutating endpoints.
    token_file: Path | None = None

    def validate(self) -> Problems:
        """The token file must be readable when set."""
        if self.token_file is not None:
            problem = secret_problem(resolve_secret(self.token_file))
            if problem:
                yield "token_file", problem


@dataclass(frozen=True, slots=True)
class Config:
    """The whole configuration."""

    node: NodeConfig
    sources: dict[str, SourceConfig]
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    api: ApiConfig = field(default_factory=ApiConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    scheduler: SchedulerConfig | None = None
    cluster: ClusterConfig = field(default_factory=ClusterConfig)

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
