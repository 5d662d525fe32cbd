"""The [sources.NAME] tables: one dataclass per source type, tagged by `type`."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

from daemon.typed_toml import bounded

Problems = Iterator[tuple[str, str]]


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
