"""A fleet's replay sharded by rack: each rack's trace replayed apart, the decisions merged.

A rack's policy reads only its own nodes' and its rack's readings, and its rack
budget, resume stagger and rack-wide followers count only its own nodes. Only two
gates see across racks: the cluster drain budget and the trip-storm breaker. So
replaying each rack's trace on its own (in processes of their own) and merging the
decisions by evaluation time, then by the merged header's node order, prints the
serial replay's bytes, as long as neither cluster-wide gate could have acted. That
is checked over the merged decisions (:func:`cluster_gates_quiet`, conservatively);
where it fails, the caller replays the merged trace serially instead.

The racks' traces must be on one clock: the same first reading time and the same
last, and the same wall time for the same monotonic time (as one recorder, or the
simulator, writes them), so that every shard evaluates on the serial replay's grid.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Iterable, Iterator, Sequence
from operator import attrgetter

from policies.model import Action, Reading
from policies.safety import budget
from policies.settings import PolicySettings
from policies.trace import Header


def merge_racks(
    racks: Sequence[tuple[Header, Iterable[Reading]]],
) -> tuple[Header, Iterator[Reading]]:
    """One trace of several racks' traces: their headers joined, readings in time order.

    Readings at the same time keep the order of ``racks``, then their trace's order.
    """
    joined: dict[str, tuple[str, ...]] = {}
    for header, _ in racks:
        for rack, nodes in header.racks.items():
            if rack in joined:
                raise ValueError(f"rack {rack!r} is in two traces")
            joined[rack] = tuple(nodes)
    readings = heapq.merge(*(r for _, r in racks), key=attrgetter("mono"))
    return Header(joined), readings


def merge_decisions(header: Header, outputs: Iterable[str]) -> list[str]:
    """The decision lines of the racks' replays in the serial replay's order.

    That order: by evaluation time (``mono``), then by the node's place in ``header``.
    """
    place = {node: i for i, node in enumerate(n for nodes in header.racks.values() for n in nodes)}
    keyed = []
    for out in outputs:
        for line in out.splitlines():
            record = json.loads(line)
            keyed.append((record["mono"], place[record["node"]], line))
    keyed.sort(key=lambda k: (k[0], k[1]))
    return [line for _, _, line in keyed]


def cluster_gates_quiet(header: Header, lines: Iterable[str], s: PolicySettings) -> bool:
    """Neither cluster-wide gate could have acted on these merged decisions.

    Conservative: every drain or exclusion counts as a trip, and the cluster budget
    is taken as binding at any decision made with as many other nodes out as it allows.
    """
    cluster = sum(len(nodes) for nodes in header.racks.values())
    cap = budget(cluster, s.cluster_budget_nodes, s.cluster_budget_pct)
    storm = budget(cluster, s.storm_trips, s.storm_pct)
    out: set[str] = set()
    trips: list[float] = []
    for line in lines:
        record = json.loads(line)
        node, now = record["node"], float(record["mono"])
        if record["action"] == Action.RESUME.value:
            out.discard(node)
            continue
        if len(out - {node}) >= cap:
            return False
        if node not in out:
            out.add(node)
            trips.append(now)
            if sum(1 for t in trips if now - t <= s.storm_window_s) > storm:
                return False
    return True
