"""Merging racks' traces and decisions into the serial replay's order, and the gates' check."""

from __future__ import annotations

import json

import pytest

from policies.model import Quality, Reading, SensorKind
from policies.settings import PolicySettings
from policies.shards import cluster_gates_quiet, merge_decisions, merge_racks
from policies.trace import Header


def _reading(mono: float, node: str) -> Reading:
    return Reading("gpus", "t", SensorKind.GPU_TEMPERATURE, 60.0, "c", Quality.GOOD, mono, mono,
                   labels={"node": node, "gpu": "0"})  # fmt: skip


def test_readings_merge_in_time_then_in_rack_order() -> None:
    a = (Header({"ra": ("a1",)}), [_reading(0.0, "a1"), _reading(1.0, "a1")])
    b = (Header({"rb": ("b1",)}), [_reading(0.0, "b1"), _reading(0.5, "b1")])
    header, readings = merge_racks([a, b])
    assert dict(header.racks) == {"ra": ("a1",), "rb": ("b1",)}
    assert [(r.mono, r.labels["node"]) for r in readings] == [
        (0.0, "a1"), (0.0, "b1"), (0.5, "b1"), (1.0, "a1"),
    ]  # fmt: skip


def test_a_rack_in_two_traces_is_refused() -> None:
    with pytest.raises(ValueError, match="rack 'ra' is in two traces"):
        merge_racks([(Header({"ra": ("a1",)}), []), (Header({"ra": ("a2",)}), [])])


def _line(mono: float, node: str, action: str = "drain") -> str:
    return json.dumps({"type": "decision", "node": node, "action": action, "mono": mono})


def test_decisions_merge_by_time_then_by_the_header_s_node_order() -> None:
    header = Header({"ra": ("a1", "a2"), "rb": ("b1",)})
    got = merge_decisions(
        header, [_line(5.0, "b1") + "\n", _line(5.0, "a2") + "\n" + _line(6.0, "a1")]
    )
    assert [json.loads(x)["node"] for x in got] == ["a2", "b1", "a1"]


def test_the_gates_are_quiet_under_the_budget_and_not_at_it() -> None:
    header = Header({f"r{i}": tuple(f"r{i}n{k}" for k in range(4)) for i in range(4)})
    s = PolicySettings(cluster_budget_nodes=3, cluster_budget_pct=0.0, storm_trips=10)
    three = [_line(1.0, "r0n0"), _line(1.0, "r1n0"), _line(2.0, "r2n0")]
    assert cluster_gates_quiet(header, three, s)
    # A fourth with three others out: the serial replay might have withheld it.
    assert not cluster_gates_quiet(header, [*three, _line(3.0, "r3n0")], s)
    # ... but not once one of them has resumed.
    resumed = [*three, _line(2.5, "r0n0", "resume"), _line(3.0, "r3n0")]
    assert cluster_gates_quiet(header, resumed, s)


def test_a_trip_storm_is_not_quiet() -> None:
    header = Header({"r": tuple(f"n{k}" for k in range(40))})
    s = PolicySettings(cluster_budget_nodes=100, storm_trips=2, storm_pct=0.0)
    trips = [_line(float(k), f"n{k}") for k in range(3)]
    assert cluster_gates_quiet(header, trips[:2], s)
    assert not cluster_gates_quiet(header, trips, s)
