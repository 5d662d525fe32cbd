"""The [policy] table: the pure policy's own settings plus the daemon's few of its own."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from daemon.config.typed_toml import bounded
from policies.settings import PolicySettings

_POLICY_FIELDS = tuple(f.name for f in dataclasses.fields(PolicySettings))


@dataclass(frozen=True, slots=True)
class PolicyConfig(PolicySettings):
    """Every key of policies.settings.PolicySettings (defined there once), and the daemon's.

    Every key is documented in systemd/rackguard.example.toml.
    """

    evaluate_interval_s: float = bounded(1.0, ge=0.01, le=60, doc="seconds between evaluations")
    # Record every reading to this trace file for `rackguard replay` ("" = off).
    record_trace: str = bounded("", doc="trace file recording every reading")
    # Rotate the recording to <record_trace>.1 past this size.
    record_max_mb: float = bounded(256.0, gt=0, doc="rotate the recording past this size")


def policy_settings(cfg: PolicyConfig) -> PolicySettings:
    """The pure policy's settings from the validated config (the same fields, copied)."""
    return PolicySettings(**{name: getattr(cfg, name) for name in _POLICY_FIELDS})
