"""The [policy] table: how decisions are made."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from daemon.typed_toml import bounded
from policies.threshold import ThresholdSettings

Problems = Iterator[tuple[str, str]]


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


def policy_settings(cfg: PolicyConfig) -> ThresholdSettings:
    """The pure policy's settings from the validated config."""
    return ThresholdSettings(
        enter_margin_c=cfg.enter_margin_c,
        exit_margin_c=cfg.exit_margin_c,
        critical_margin_c=cfg.critical_margin_c,
        min_dwell_s=cfg.min_dwell_s,
        resume_after_s=cfg.resume_after_s,
        stale_after_s=cfg.stale_after_s,
        dry_run=cfg.dry_run,
    )
