"""rackguard's configuration: one TOML file, validated into frozen typed objects at start.

Every key is documented in systemd/rackguard.example.toml, which a test loads.
"""

from __future__ import annotations

import ipaddress
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from daemon.config.cluster import ClusterConfig
from daemon.config.network import is_loopback
from daemon.config.opcua import OpcuaSourceConfig
from daemon.config.policy import PolicyConfig
from daemon.config.power_cap import PowerCapConfig
from daemon.config.scheduler import (
    NO_NODE_SETTING,
    SchedulerConfig,
    WebhookSchedulerConfig,
)
from daemon.config.secrets import read_secret, resolve_secret, secret_problem
from daemon.config.snmp import SnmpSourceConfig
from daemon.config.sources import NvmlSourceConfig
from daemon.config.steering import SteeringConfig
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
    "PowerCapConfig",
    "SnmpSourceConfig",
    "SourceConfig",
    "SteeringConfig",
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
        elif not self.name.isprintable():
            # It goes into sd_notify STATUS=, scheduler reasons and every log record.
            yield "name", f"must be printable (no control characters), got {self.name!r}"
        if not self.rack.isprintable():
            yield "rack", f"must be printable (no control characters), got {self.rack!r}"


@dataclass(frozen=True, slots=True)
class LoggingConfig:
    """Where and how much to log."""

    level: Literal["debug", "info", "warning", "error"] = "info"
    # auto: journald style (no timestamps, syslog priority prefixes) when
    # systemd's JOURNAL_STREAM is set, plain text with timestamps otherwise.
    format: Literal["auto", "text", "journald"] = "auto"


_HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9]([-A-Za-z0-9]{0,62})(\.[A-Za-z0-9][-A-Za-z0-9]{0,62})*$"
)


@dataclass(frozen=True, slots=True)
class ApiConfig:
    """The HTTP API for schedulers and operators."""

    listen: str = "127.0.0.1"
    port: int = bounded(9470, ge=0, le=65535)
    # Bearer token for POST /v1/overrides; unset disables the mutating endpoints.
    # On a non-loopback address every read but /healthz and /readyz needs it too.
    token_file: Path | None = None
    # On a non-loopback address without a token, the API is refused unless
    # this says, explicitly, that anyone who can reach it may read it.
    unauthenticated_reads: bool = False
    # Open connections and /v1/events streams served at once; past either the
    # API answers 503, so local users cannot take the file descriptors that
    # deliveries need (the daemon keeps a reserve; see docs/operations.md).
    max_connections: int = bounded(128, ge=1, le=4096)
    max_event_streams: int = bounded(32, ge=1, le=1024)

    @property
    def reads_need_token(self) -> bool:
        """Reads (GETs other than the probes) need the bearer token."""
        return not is_loopback(self.listen) and not self.unauthenticated_reads

    def validate(self) -> Problems:
        """A usable address; the token file must be private and readable when set."""
        if not (_HOSTNAME.match(self.listen) or _is_ip(self.listen)):
            yield "listen", f"must be an IP address or a host name, got {self.listen!r}"
        elif self.token_file is None and self.reads_need_token:
            yield (
                "listen",
                f"{self.listen!r} is reachable from other machines and no token_file is set:"
                " set token_file, or unauthenticated_reads = true to let anyone read",
            )
        if self.token_file is not None:
            problem = secret_problem(resolve_secret(self.token_file))
            if problem:
                yield "token_file", problem
        if self.max_event_streams > self.max_connections:
            yield (
                "max_event_streams",
                f"must be at most max_connections ({self.max_connections}),"
                f" got {self.max_event_streams}",
            )


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


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
    steering: SteeringConfig = field(default_factory=SteeringConfig)
    power_cap: PowerCapConfig = field(default_factory=PowerCapConfig)

    def validate(self) -> Problems:
        """At least one source, with names usable in logs and metrics."""
        if not self.sources:
            yield "sources", "at least one source is required"
        for name in self.sources:
            if not name.replace("-", "_").isidentifier():
                yield f"sources.{name}", "source names may hold letters, digits, '-' and '_'"
        yield from self._poll_problems()
        if self.scheduler is not None:
            yield from self.scheduler.cross_problems(
                lead_time_s=self.policy.lead_time_s, steering=self.steering.enabled
            )
        elif self.steering.enabled:
            yield "steering.enabled", NO_NODE_SETTING

    def _poll_problems(self) -> Problems:
        """A source polled no faster than its readings go stale: the policy would never act.

        Each reading is as old as its poll; polled every ``interval_s`` >= the stale
        limit, every GPU (or rack) reading is stale before the next one lands, so the
        node stays UNKNOWN and nothing is ever drained, with every poll succeeding.
        """
        for name, source in self.sources.items():
            gpus = isinstance(source, NvmlSourceConfig)
            key = "policy.stale_after_s" if gpus else "policy.rack_stale_after_s"
            limit = self.policy.stale_after_s if gpus else self.policy.rack_stale_after_s
            if source.interval_s >= limit:
                yield (
                    f"sources.{name}.interval_s",
                    f"{source.interval_s:g} s is not under {key} ({limit:g} s): each reading"
                    " would be stale before the next poll and the policy would decide"
                    f" nothing; poll more often or raise {key}",
                )


def config_notes(config: Config) -> list[str]:
    """Settings that are valid but take no effect as configured: said, not refused."""
    notes: list[str] = []
    policy = config.policy
    derating = [
        f"policy.racks.{rack}.inlet_derate_limit_c"
        for rack, own in sorted(policy.racks.items())
        if own.inlet_derate_limit_c is not None
    ]
    if policy.inlet_derate_limit_c is not None:
        derating.insert(0, "policy.inlet_derate_limit_c")
    if derating and not config.power_cap.enabled:
        notes.extend(
            f"{key}: no effect while [power_cap] enabled = false (no GPU can be derated:"
            " racks drain at their inlet limit)"
            for key in derating
        )
    return notes


def parse_config(text: str, *, origin: str = "<config>") -> Config:
    """Parse and validate TOML text."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError([f"{origin}: not valid TOML: {err}"]) from err
    return load_typed(Config, data)


def read_config_text(path: Path) -> str:
    """A config file's text; ConfigError if it cannot be read or is not UTF-8."""
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise ConfigError([f"{path}: cannot read config: {err.strerror or err}"]) from err
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        raise ConfigError(
            [
                f"{path}: not UTF-8 text (byte 0x{raw[err.start]:02x} on line {line});"
                " TOML files are UTF-8: convert it (e.g. iconv -f latin1 -t utf-8)"
            ]
        ) from err


def load_config(path: Path) -> Config:
    """Read, parse and validate a config file."""
    return parse_config(read_config_text(path), origin=str(path))
