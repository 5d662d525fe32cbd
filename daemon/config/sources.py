"""The [sources.NAME] tables: one dataclass per source type, tagged by `type`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

from daemon.config.typed_toml import Problems, bounded


@dataclass(frozen=True, slots=True)
class SourceTiming:
    """Scheduling shared by every source; see daemon/service/runner.py."""

    interval_s: float
    timeout_s: float
    backoff_initial_s: float
    backoff_max_s: float
    down_after: int


class Polled(Protocol):
    """The scheduling fields every source table has (defaults differ per type)."""

    @property
    def interval_s(self) -> float: ...
    @property
    def timeout_s(self) -> float: ...
    @property
    def backoff_initial_s(self) -> float: ...
    @property
    def backoff_max_s(self) -> float: ...
    @property
    def down_after(self) -> int: ...


def timing_of(cfg: Polled) -> SourceTiming:
    """The runner's view of a source."""
    return SourceTiming(
        cfg.interval_s, cfg.timeout_s, cfg.backoff_initial_s, cfg.backoff_max_s, cfg.down_after
    )


def timing_problems(cfg: Polled) -> Problems:
    """The cross-field checks every source's scheduling needs."""
    if cfg.timeout_s >= cfg.interval_s:
        yield (
            "timeout_s",
            f"must be less than interval_s ({cfg.interval_s}), got {cfg.timeout_s}",
        )
    if cfg.backoff_max_s < cfg.backoff_initial_s:
        yield (
            "backoff_max_s",
            f"must be at least backoff_initial_s ({cfg.backoff_initial_s}), "
            f"got {cfg.backoff_max_s}",
        )


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
        return timing_of(self)

    def validate(self) -> Problems:
        """Cross-field checks."""
        yield from timing_problems(self)
        for i, gpu in enumerate(self.gpus):
            if gpu < 0:
                yield f"gpus[{i}]", f"must be a GPU index (>= 0), got {gpu}"
