"""Deterministic thermal simulator of one rack and the scenarios that drive every fake."""

from fakes.sim.nvml_bridge import SimulatedRack, apply_node
from fakes.sim.scenario import (
    Crossing,
    Event,
    EventKind,
    Expect,
    Facility,
    Noise,
    RackLayout,
    Scenario,
    ScenarioError,
    list_scenarios,
    load_scenario,
    parse_event,
    parse_scenario,
)
from fakes.sim.thermal import (
    SUBSTEP_S,
    CduSnapshot,
    GpuSnapshot,
    NodeSnapshot,
    RackSimulator,
    RackSnapshot,
)

__all__ = [
    "SUBSTEP_S",
    "CduSnapshot",
    "Crossing",
    "Event",
    "EventKind",
    "Expect",
    "Facility",
    "GpuSnapshot",
    "NodeSnapshot",
    "Noise",
    "RackLayout",
    "RackSimulator",
    "RackSnapshot",
    "Scenario",
    "ScenarioError",
    "SimulatedRack",
    "apply_node",
    "list_scenarios",
    "load_scenario",
    "parse_event",
    "parse_scenario",
]
