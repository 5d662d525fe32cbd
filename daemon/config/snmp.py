"""[sources.NAME] with type = "snmp": one rack PDU or cooling unit (daemon/sources.py builds it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

# Profiles are TOML data: loading them needs no pysnmp.
from adapters.sensors.snmp_profiles import ProfileError, usable_profiles
from daemon.config.secrets import resolve_secret, secret_problem
from daemon.config.sources import SourceTiming, timing_of, timing_problems
from daemon.config.typed_toml import Problems, bounded


@dataclass(frozen=True, slots=True)
class SnmpSourceConfig:
    """A PDU or cooling unit over SNMPv2c or SNMPv3; secrets only from files."""

    type: Literal["snmp"]
    host: str
    interval_s: float = bounded(10.0, gt=0, le=3600)
    timeout_s: float = bounded(5.0, gt=0)
    backoff_initial_s: float = bounded(5.0, gt=0)
    backoff_max_s: float = bounded(300.0, gt=0)
    down_after: int = bounded(3, ge=1)
    port: int = bounded(161, ge=1, le=65535)
    version: Literal["2c", "3"] = "2c"
    # SNMPv2c: the community, from a file (or a systemd credential name).
    community_file: Path | None = None
    # SNMPv3 (USM): user, protocols and keys (from files).
    user: str = ""
    auth_protocol: Literal["sha", "sha224", "sha256", "sha384", "sha512"] = "sha"
    auth_key_file: Path | None = None
    priv_protocol: Literal["none", "aes", "aes128", "aes192", "aes256", "aes192c", "aes256c"] = (
        "aes"
    )
    priv_key_file: Path | None = None
    # A profile id or a path to a .toml profile; "" picks one by sysObjectID.
    profile: str = ""
    # Extra profiles (*.toml), matched along with the shipped ones.
    profile_dir: Path | None = None
    # Most OIDs in one GET; some PDUs fail above 16-32.
    max_varbinds: int = bounded(16, ge=1, le=128)
    # GETBULK max-repetitions for the table walks at connect (a profile may lower it).
    max_repetitions: int = bounded(10, ge=1, le=50)
    # One request's wait for an answer, and how often it is resent.
    request_timeout_s: float = bounded(1.0, gt=0)
    retries: int = bounded(1, ge=0, le=5)
    # The whole poll (every GET of one read) must finish within this.
    poll_deadline_s: float = bounded(4.0, gt=0)
    # Probe (its name on the device as `rackguard probe` shows it, e.g. "A1", or its
    # row index, e.g. "1.1") -> position, e.g. {"A1" = "bottom"}.
    probe_positions: dict[str, str] = field(default_factory=dict)

    @property
    def timing(self) -> SourceTiming:
        """The runner's view of this source."""
        return timing_of(self)

    def validate(self) -> Problems:
        """Cross-field checks and secret files that exist and are not empty."""
        yield from timing_problems(self)
        if self.poll_deadline_s > self.timeout_s:
            yield (
                "poll_deadline_s",
                f"must be at most timeout_s ({self.timeout_s}), got {self.poll_deadline_s}",
            )
        if not self.host.strip():
            yield "host", "must name the device (host name or address)"
        if self.version == "2c":
            yield from self._secret("community_file", self.community_file, "version = '2c'")
            for key in ("auth_key_file", "priv_key_file"):
                if getattr(self, key) is not None:
                    yield key, "is only used with version = '3'"
        else:
            if not self.user:
                yield "user", "required with version = '3'"
            yield from self._secret("auth_key_file", self.auth_key_file, "version = '3'")
            if self.priv_protocol != "none":
                yield from self._secret(
                    "priv_key_file", self.priv_key_file, f"priv_protocol = {self.priv_protocol!r}"
                )
            elif self.priv_key_file is not None:
                yield "priv_key_file", "is not used with priv_protocol = 'none'"
            if self.community_file is not None:
                yield "community_file", "is only used with version = '2c'"
        for label, position in self.probe_positions.items():
            if not position.strip():
                yield f"probe_positions.{label}", "must name a position, e.g. 'top'"
        yield from self._check_profiles()

    def _check_profiles(self) -> Problems:
        """Every profile `probe` and `run` would load, loaded now (names file and key)."""
        try:
            usable_profiles(self.profile, self.profile_dir)
        except ProfileError as err:
            text = str(err)
            yield (
                (
                    "profile_dir"
                    if self.profile_dir and str(self.profile_dir) in text
                    else "profile"
                ),
                text,
            )

    @staticmethod
    def _secret(key: str, path: Path | None, why: str) -> Problems:
        if path is None:
            yield key, f"required with {why}"
            return
        problem = secret_problem(resolve_secret(path))
        if problem:
            yield key, problem
