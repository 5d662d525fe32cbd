"""Kubernetes' node listing: the rack from the node label ``topology.rackguard.io/rack``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from adapters.schedulers.base import NodeView
from adapters.schedulers.listing import ListedNode

RACK_LABEL = "topology.rackguard.io/rack"


def listed_kube(node: Mapping[str, Any], view: NodeView) -> ListedNode:
    """A Kubernetes node object: the rack label."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    rack = labels.get(RACK_LABEL, "")
    return ListedNode(view, rack if isinstance(rack, str) else "")
