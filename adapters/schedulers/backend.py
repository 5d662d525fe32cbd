"""A scheduler backend: one client, and the capabilities built on it.

Each backend is one package (adapters/schedulers/<name>/) whose ``backend.py``
holds its Backend. The daemon asks a Backend for what it needs and gets None
where the scheduler offers none; it never asks which scheduler it is.
"""

from __future__ import annotations

from typing import Protocol

from adapters.base import SchedulerSink
from adapters.schedulers.jobs import JobHandling
from adapters.schedulers.listing import NodeLister
from adapters.schedulers.node_setting import NodeSetting


class Backend(Protocol):
    """One scheduler's capabilities, all through the one client it owns."""

    @property
    def name(self) -> str:
        """The config's ``type`` ("slurm", "kubernetes", "webhook")."""

    def sink(self) -> SchedulerSink:
        """Where decisions are delivered (it closes the client)."""

    def lister(self) -> NodeLister | None:
        """Every node in one read, for the fleet's view; None: the scheduler cannot list."""

    def job_control(self) -> JobHandling | None:
        """The work running on a node, and how it is told; None: the scheduler has none."""

    def node_setting(self, label_key: str) -> NodeSetting | None:
        """The node setting steering writes (``label_key``: where the scheduler takes a
        name, a Kubernetes label); None: nothing to steer."""
