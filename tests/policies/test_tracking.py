"""Readings routed to their GPU or rack: by label, else the node's rack, else the only rack."""

from __future__ import annotations

from policies.model import Quality, Reading, SensorKind
from policies.settings import PolicySettings
from policies.tracking import Tracker, gpu_kind

RACKS = {"r1": ("n1", "n2"), "r2": ("n3",)}


def _reading(kind: SensorKind, labels: dict[str, str], value: float = 30.0) -> Reading:
    return Reading("s", "x", kind, value, "u", Quality.GOOD, 1.0, 1.0, labels=labels)


def test_gpu_readings_go_to_their_node_and_gpu_and_unknown_nodes_are_ignored() -> None:
    t = Tracker(PolicySettings(), RACKS)
    t.observe(
        [
            _reading(SensorKind.GPU_TEMPERATURE, {"node": "n2", "gpu": "3"}, 61.0),
            _reading(SensorKind.GPU_TEMPERATURE, {"node": "elsewhere", "gpu": "0"}),
            _reading(SensorKind.GPU_TEMPERATURE, {"node": "n1"}),  # no GPU label
        ]
    )
    assert list(t.nodes["n2"].gpus) == ["3"]
    assert t.nodes["n2"].gpus["3"].fresh_temperature(1.0, 5.0) == 61.0
    assert not t.nodes["n1"].gpus and "elsewhere" not in t.nodes


def test_a_default_node_takes_gpu_readings_without_a_node_label() -> None:
    t = Tracker(PolicySettings(), RACKS, default_node="n3")
    t.observe([_reading(SensorKind.GPU_TEMPERATURE, {"gpu": "0"})])
    assert list(t.nodes["n3"].gpus) == ["0"]


def test_rack_readings_go_by_rack_label_else_by_the_node_label_s_rack() -> None:
    t = Tracker(PolicySettings(), RACKS)
    t.observe(
        [
            _reading(SensorKind.INLET_TEMPERATURE, {"rack": "r2"}),
            _reading(SensorKind.COOLANT_SUPPLY_TEMPERATURE, {"node": "n2"}),
            _reading(SensorKind.COOLANT_FLOW, {}),  # no label and two racks: nowhere
        ]
    )
    assert t.rack["r2"].slow[SensorKind.INLET_TEMPERATURE]
    assert t.rack["r1"].slow[SensorKind.COOLANT_SUPPLY_TEMPERATURE]
    assert not t.rack["r1"].slow[SensorKind.COOLANT_FLOW]
    assert not t.rack["r2"].slow[SensorKind.COOLANT_FLOW]


def test_with_one_rack_an_unlabelled_rack_reading_is_that_rack_s() -> None:
    t = Tracker(PolicySettings(), {"only": ("n1",)})
    t.observe([_reading(SensorKind.COOLANT_FLOW, {})])
    assert t.rack["only"].slow[SensorKind.COOLANT_FLOW]


def test_gpu_kinds_are_the_gpu_prefixed_ones() -> None:
    assert gpu_kind(SensorKind.GPU_POWER_LIMIT)
    assert not gpu_kind(SensorKind.INLET_TEMPERATURE)


def test_a_gpu_s_readings_in_a_row_go_to_that_gpu_whatever_other_labels_they_carry() -> None:
    # The tracker reuses the last GPU found while the labels equal its: readings of one
    # GPU with an extra label, and of another GPU in between, still land where they name.
    t = Tracker(PolicySettings(), RACKS)
    t.observe(
        [
            _reading(SensorKind.GPU_TEMPERATURE, {"node": "n1", "gpu": "0"}, 60.0),
            _reading(SensorKind.GPU_SLOWDOWN_THRESHOLD, {"node": "n1", "gpu": "0"}, 90.0),
            _reading(SensorKind.GPU_TEMPERATURE, {"node": "n1", "gpu": "1"}, 70.0),
            _reading(SensorKind.GPU_SLOWDOWN_THRESHOLD, {"node": "n1", "gpu": "1", "x": "y"}, 85.0),
            _reading(SensorKind.GPU_MEMORY_TEMPERATURE, {"node": "n2", "gpu": "1"}),
            _reading(SensorKind.GPU_SLOWDOWN_THRESHOLD, {"node": "n2", "gpu": "1"}, 80.0),
        ]
    )
    gpus = t.nodes["n1"].gpus
    assert sorted(gpus) == ["0", "1"]
    assert gpus["0"].fresh_slowdown(1.0, 5.0) == 90.0
    assert gpus["1"].fresh_temperature(1.0, 5.0) == 70.0
    assert gpus["1"].fresh_slowdown(1.0, 5.0) == 85.0
    # A kind no field keeps still makes the GPU known; the next reading is its own.
    assert t.nodes["n2"].gpus["1"].fresh_slowdown(1.0, 5.0) == 80.0
