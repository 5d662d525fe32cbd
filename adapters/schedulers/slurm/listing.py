"""Slurm's node listing: the rack from a node feature ``rack_<name>``, the reason's time."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from adapters.schedulers.base import NodeView
from adapters.schedulers.listing import ListedNode
from adapters.schedulers.slurm.reason import split_reason

RACK_FEATURE_PREFIX = "rack_"


def slurm_rack(features: object) -> str:
    """The rack named by a ``rack_<name>`` feature (a list, or a comma-separated string)."""
    words = features.split(",") if isinstance(features, str) else features
    if not isinstance(words, list):
        return ""
    for word in words:
        if isinstance(word, str) and word.startswith(RACK_FEATURE_PREFIX):
            return word.removeprefix(RACK_FEATURE_PREFIX)
    return ""


def slurm_time(value: object) -> float | None:
    """A Slurm time: an int (<= v0.0.38) or ``{"set": true, "number": N}`` (>= v0.0.39)."""
    if isinstance(value, Mapping):
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return None
    return float(value)


def listed_slurm(node: Mapping[str, Any], view: NodeView) -> ListedNode:
    """A REST node object with its already-normalised view."""
    features = node.get("active_features") or node.get("features") or []
    return ListedNode(view, slurm_rack(features), slurm_time(node.get("reason_changed_at")))


def listed_scontrol(line: str, view: NodeView) -> ListedNode:
    """One ``scontrol -o show nodes`` line: ActiveFeatures= and the reason's ``[user@time]``."""
    split = split_reason(line)
    fields = dict(f.split("=", 1) for f in split.head.split() if "=" in f)
    features = fields.get("ActiveFeatures") or fields.get("AvailableFeatures") or ""
    at = None
    if split.at:
        try:
            at = dt.datetime.fromisoformat(split.at).timestamp()  # local time, as scontrol prints
        except ValueError:
            at = None
    return ListedNode(view, slurm_rack(features), at)
