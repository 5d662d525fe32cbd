"""The fleet coordination's state as the API shows it (/v1/state, /readyz)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from msgspec import UNSET, Meta, UnsetType


@dataclass(frozen=True, slots=True)
class SchedulerViewStatus:
    """The fleet view read from the scheduler."""

    healthy: bool
    nodes: int | None


@dataclass(frozen=True, slots=True)
class EtcdStatus:
    """The etcd coordination's connection."""

    up: bool
    failures: int
    error: str | UnsetType = UNSET  # only while down, with an error


@dataclass(frozen=True, slots=True)
class ClusterStatus:
    """The fleet coordination: which mode, and whether it works now."""

    mode: Annotated[str, Meta(extra_json_schema={"enum": ["lone", "scheduler", "etcd"]})]
    degraded: bool
    scheduler_view: SchedulerViewStatus | UnsetType = UNSET
    etcd: EtcdStatus | UnsetType = UNSET
