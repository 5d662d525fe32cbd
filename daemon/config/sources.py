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


# Below these a poll loop only burns CPU (and a device's patience). Real
# devices want a second or more; the demo compresses time (1 s simulated at
# x100 is 10 ms), which is why the floor is not higher.
MIN_INTERVAL_S = 0.01
MIN_TIMEOUT_S = 0.005


def timing_problems(cfg: Polled) -> Problems:
    """The cross-field checks every source's scheduling needs."""
    if cfg.interval_s < MIN_INTERVAL_S:
        yield "interval_s", f"must be at least {MIN_INTERVAL_S}, got {cfg.interval_s}"
    if cfg.timeout_s < MIN_TIMEOUT_S:
        yield "timeout_s", f"must be at least {MIN_TIMEOUT_S}, got {cfg.timeout_s}"
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
    # The NVML binding: nvidia-ml-py's "pynvml", the only one. The setting names
    # no module to import (that would let a config swap real GPUs for anything);
    # tests and the demo inject a simulated NVML instead (see fakes/nvml_module.py).
    binding: Literal["pynvml"] = "pynvml"
    # GPU indices to poll; empty means every GPU NVML reports.
    gpus: list[int] = field(default_factory=list)

    @property
    def timing(self) -> SourceTiming:
        """The runner's view of this source."""
        return timing_of(self)

    def validate(self) -> Problems:
        """Cross-field checks."""
        yield from timing_problems(self)
        seen: set[int] = set()
        for i, gpu in enumerate(self.gpus):
            if gpu < 0:
                yield f"gpus[{i}]", f"must be a GPU index (>= 0), got {gpu}"
            elif gpu in seen:
                yield f"gpus[{i}]", f"GPU {gpu} is listed twice"
            seen.add(gpu)
