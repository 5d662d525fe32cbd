"""What the policy remembers per series: the latest reading, and a forecaster for slow ones.

Readings are routed by kind: ``gpu_*`` kinds belong to a node (label ``node``,
else the tracker's default node), everything else (inlet air, PDU, coolant) to a
rack (label ``rack``, else the rack of the node label, else the default rack).
Feeding the same reading twice changes nothing, so a caller may pass every
latest reading on every evaluation.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

from policies.gpu_tracker import TAKES, GpuTracker
from policies.model import Reading, SensorKind
from policies.rack_tracker import RackTracker
from policies.settings import PolicySettings

_GPU_KINDS: Final = frozenset(k for k in SensorKind if k.value.startswith("gpu_"))


def gpu_kind(kind: SensorKind) -> bool:
    """True for the kinds that belong to one GPU of one node."""
    return kind in _GPU_KINDS


@dataclass
class NodeTracker:
    """The GPUs of one node, by GPU index label."""

    gpus: dict[str, GpuTracker] = field(default_factory=dict)


@dataclass(eq=False)
class Tracker:
    """Every node's GPUs and every rack's evidence, fed with readings."""

    settings: PolicySettings
    racks: Mapping[str, tuple[str, ...]]
    default_node: str | None = field(default=None, kw_only=True)
    rack_of: dict[str, str] = field(init=False)
    nodes: dict[str, NodeTracker] = field(init=False)
    rack: dict[str, RackTracker] = field(init=False)

    def __post_init__(self) -> None:
        self.racks = dict(self.racks)
        self.rack_of = {node: rack for rack, nodes in self.racks.items() for node in nodes}
        self.nodes = {n: NodeTracker() for n in self.rack_of}
        self.rack = {rk: RackTracker(self.settings) for rk in self.racks}

    def configure(self, settings: PolicySettings) -> None:
        """Read these settings from now on (a reload that keeps the windows' shape).

        The GPUs and racks already tracked read them too, not only those seen after.
        """
        self.settings = settings
        for node in self.nodes.values():
            for g in node.gpus.values():
                g.configure(settings)
        for rt in self.rack.values():
            rt.configure(settings)

    def observe(self, readings: Iterable[Reading]) -> None:
        """Route readings to their GPU or rack; unknown nodes and racks are ignored."""
        nodes, default_node, gpu_kinds, takes = self.nodes, self.default_node, _GPU_KINDS, TAKES
        racks, rack_of = self.rack, self.rack_of
        # Once, not per reading: a member read from its enum class is a call on Python 3.11.
        temperature = SensorKind.GPU_TEMPERATURE
        # A GPU's readings come together (temperature, thresholds, power, limit) and a
        # node's GPUs too: the last GPU found is kept, and reused while a reading's
        # labels equal the labels it was found by (one comparison in C, where reading
        # its labels and looking them up again would be several).
        last_labels: Mapping[str, str] | None = None
        last_node, last = "", None  # the node of the last GPU found, and it
        rack_node, node_rack = "", None  # the last node whose rack was looked up, and it
        for r in readings:
            kind = r.kind
            labels = r.labels
            # GpuTracker.observe, its table read here: one call a reading, not two. A kind
            # in the table is a GPU's; another may still be (one no field keeps).
            take = takes.get(kind)
            if take is not None or kind in gpu_kinds:
                if last is not None and labels == last_labels:
                    g, on = last, last_node
                else:
                    gpu = labels.get("gpu")
                    node = labels.get("node") or default_node
                    if gpu is None or node is None:
                        continue
                    tracker = nodes.get(node)
                    if tracker is None:
                        continue
                    found = tracker.gpus.get(gpu)
                    if found is None:
                        found = tracker.gpus[gpu] = GpuTracker(self.settings)
                    last_labels, last_node, last = labels, node, found
                    g, on = found, node
                if take is not None:
                    take(g, r)
                if kind is temperature:
                    if on != rack_node or not on:
                        rack_node = on
                        node_rack = racks.get(rack_of.get(on, "")) if on else None
                    at = g.temperature_at  # r.mono, as observe kept it
                    reference = node_rack.reference(at) if node_rack is not None else None
                    g.sample_resistance(reference)
                continue
            node = labels.get("node") or default_node
            rack = labels.get("rack") or (self.rack_of.get(node) if node else None)
            if rack is None and len(self.rack) == 1:
                rack = next(iter(self.rack))
            rt = self.rack.get(rack) if rack is not None else None
            if rt is not None:
                rt.observe(r)
