"""Every node the scheduler holds, with its rack and when its reason was set: the fleet's view.

One read of all nodes (each backend's ``list_nodes``: Slurm ``GET /slurm/<v>/nodes``
or ``scontrol -o show nodes``, the Kubernetes node list) is what the daemon turns
into the policy's ``ClusterView`` every ``cluster_view_interval_s``. Each backend
says where a node's rack comes from (adapters/schedulers/<name>/listing.py); nodes
without one take their rack from the config.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from adapters.schedulers.base import NodeView


@dataclass(frozen=True, slots=True)
class ListedNode:
    """One node of the scheduler's full listing."""

    view: NodeView
    rack: str = ""  # from the scheduler ("" when it does not say)
    reason_at: float | None = None  # wall time the reason was set, when the scheduler says


@runtime_checkable
class NodeLister(Protocol):
    """A sink that can list every node in one read."""

    async def list_nodes(self) -> list[ListedNode]:
        """All nodes; raises NodeReadError when the scheduler cannot be read."""


@runtime_checkable
class FollowingLister(NodeLister, Protocol):
    """A lister that can keep the list by watch: ``follow(True)`` while this agent reads for all."""

    def follow(self, on: bool) -> None:
        """Start (True) or stop (False) keeping the list current; reads stay ``list_nodes``."""

    def watch_counts(self) -> Mapping[str, int]:
        """Requests and events so far, by kind (lists, pages, watches, relists, bookmarks,
        events, malformed): what the watch cost the API server and what it refused."""
