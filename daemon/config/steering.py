"""The [steering] table: publish this node's headroom at full load so new work goes to cool nodes.

Opt-in. Slurm: the node's ``Weight`` (lower is preferred); Kubernetes: a node
label holding the bucket's number (0 = least headroom), for a preferred node
affinity. See docs/schedulers.md.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from adapters.schedulers.kubernetes.label import label_key_problem
from adapters.schedulers.slurm.weight import SLURM_MAX_WEIGHT
from daemon.config.typed_toml import Problems, bounded

# The floors keep the controller's cost bounded (docs/schedulers.md, "Steering's
# cost"): each node reads its setting at most once per min_interval_s (twice and
# one update when it writes), so at 10,000 nodes 60 s is 167 updates/s at worst.
MIN_INTERVAL_FLOOR_S = 60.0
INTERVAL_FLOOR_S = 10.0


@dataclass(frozen=True, slots=True)
class SteeringConfig:
    """Headroom buckets and how often rackguard may rewrite the scheduler's setting."""

    enabled: bool = False
    # Headroom edges in C, ascending: N edges make N + 1 buckets, bucket 0 holding
    # the least headroom (under the first edge). The headroom is the least margin to
    # slowdown any GPU of the node would have at its enforced power limit.
    edges_c: tuple[float, ...] = (5.0, 10.0, 15.0)
    # Slurm Weight per bucket, least headroom first, strictly decreasing (lower is
    # preferred). The last is Slurm's default, 1: a cool node is never behind a node
    # rackguard does not steer.
    weights: tuple[int, ...] = (4, 3, 2, 1)
    # Kubernetes: the node label holding the bucket number ("0" .. "N").
    label_key: str = "rackguard.io/thermal-headroom"
    # A margin leaves its bucket only once this far past the edge.
    hysteresis_c: float = bounded(1.0, ge=0, le=20)
    # At most one write per node this often (the scheduler's setting is not a gauge).
    min_interval_s: float = bounded(300.0, ge=MIN_INTERVAL_FLOOR_S, le=86400)
    # How often the headroom is looked at (and a write considered).
    interval_s: float = bounded(30.0, ge=INTERVAL_FLOOR_S, le=3600)

    def validate(self) -> Problems:
        """Edges ascending, one weight per bucket, decreasing; hysteresis under half a bucket."""
        edges = self.edges_c
        if not edges:
            yield "edges_c", "at least one edge is needed (two buckets)"
        if any(b <= a for a, b in itertools.pairwise(edges)):
            yield "edges_c", f"must be strictly ascending, got {list(edges)}"
        elif len(edges) >= 2:
            half = min(b - a for a, b in itertools.pairwise(edges)) / 2
            if self.hysteresis_c >= half:
                yield (
                    "hysteresis_c",
                    f"must be under half the narrowest bucket ({half:g}C),"
                    f" got {self.hysteresis_c:g}",
                )
        if len(self.weights) != len(edges) + 1:
            yield (
                "weights",
                f"must hold one weight per bucket: {len(edges) + 1} for {len(edges)} edge(s),"
                f" got {len(self.weights)}",
            )
        if any(not 1 <= w <= SLURM_MAX_WEIGHT for w in self.weights):
            yield "weights", f"each must be from 1 to {SLURM_MAX_WEIGHT}, got {list(self.weights)}"
        elif any(b >= a for a, b in itertools.pairwise(self.weights)):
            yield (
                "weights",
                "must be strictly decreasing (least headroom first; lower is preferred),"
                f" got {list(self.weights)}",
            )
        problem = label_key_problem(self.label_key)
        if problem:
            yield "label_key", f"not a valid Kubernetes label key ({problem}): {self.label_key!r}"
