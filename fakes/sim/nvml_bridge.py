"""Write the simulator's GPU state into the fake NVML's FakeGpus, one node at a time."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pynvml

from fakes.gpus import FakeGpu, make_gpus
from fakes.sim.scenario import Scenario, load_scenario
from fakes.sim.thermal import NodeSnapshot, RackSimulator, RackSnapshot

TEMPERATURE_CALL = "nvmlDeviceGetTemperature"


def apply_node(snapshot: NodeSnapshot, gpus: list[FakeGpu]) -> None:
    """Copy a node's GPU snapshots into its FakeGpus, including sensor dropout and loss.

    A dropped-out sensor makes ``nvmlDeviceGetTemperature`` fail with NVML_ERROR_UNKNOWN;
    when it comes back that error (and only an NVML_ERROR_UNKNOWN there) is cleared.
    A lost GPU stays lost. A limit the scenario set (a ``power_cap`` event) becomes
    the GPU's power-management limit, as an admin's ``nvidia-smi -pl`` would.
    """
    if len(snapshot.gpus) != len(gpus):
        raise ValueError(
            f"{snapshot.name}: snapshot has {len(snapshot.gpus)} GPUs, got {len(gpus)} FakeGpus"
        )
    for gs in snapshot.gpus:
        fake = gpus[gs.index]
        fake.temperature_c = gs.temperature_c
        fake.memory_temperature_c = gs.memory_temperature_c
        fake.power_w = gs.power_w
        fake.follow_enforced(gs.power_limit_w)
        fake.clock_event_reasons = gs.clock_event_reasons
        if gs.dropped_out:
            fake.errors[TEMPERATURE_CALL] = pynvml.NVML_ERROR_UNKNOWN
        elif fake.errors.get(TEMPERATURE_CALL) == pynvml.NVML_ERROR_UNKNOWN:
            del fake.errors[TEMPERATURE_CALL]
        if gs.lost:
            fake.lost = True


def write_feed(snapshot: NodeSnapshot, path: Path, gpu0_c: float | None = None) -> None:
    """Write a node's GPU state for fakes/nvml_fed.py in another process (atomic replace).

    ``gpu0_c`` forces GPU 0's temperature (a false trigger: one bad sensor).
    """
    gpus = [
        {
            "t": gpu0_c if gpu0_c is not None and g.index == 0 else g.temperature_c,
            "m": g.memory_temperature_c,
            "p": g.power_w,
            "pl": g.power_limit_w,
            "c": g.clock_event_reasons,
            "dropped": g.dropped_out,
            "lost": g.lost,
        }
        for g in snapshot.gpus
    ]
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(orjson.dumps({"gpus": gpus}))
    os.replace(tmp, path)


class SimulatedRack:
    """A simulator plus one list of FakeGpus per node, kept in step with it."""

    def __init__(self, scenario: Scenario | str, *, seed: int | None = None) -> None:
        if isinstance(scenario, str):
            scenario = load_scenario(scenario)
        self.sim = RackSimulator(scenario, seed=seed)
        model = scenario.rack.model
        self.gpus_by_node: dict[str, list[FakeGpu]] = {
            name: make_gpus(model, scenario.rack.gpus_per_node, node_index=k)
            for k, name in enumerate(scenario.rack.nodes)
        }
        self._snapshot = self._publish()

    @property
    def scenario(self) -> Scenario:
        """The scenario being run."""
        return self.sim.scenario

    @property
    def t(self) -> float:
        """Simulated seconds since the start."""
        return self.sim.t

    @property
    def snapshot(self) -> RackSnapshot:
        """The snapshot last applied to the FakeGpus."""
        return self._snapshot

    def advance(self, dt: float) -> RackSnapshot:
        """Step the simulator by `dt` seconds and apply the new snapshot to every node.

        A limit set through the fake NVML since the last step (rackguard's cap, or
        ``FakeNvml.admin_set_limit``) is the simulator's from this step on: the GPUs
        draw min(demand, enforced limit).
        """
        self.take_limits()
        self.sim.step(dt)
        self._snapshot = self._publish()
        return self._snapshot

    def take_limits(self) -> None:
        """Give the simulator every enforced limit the FakeGpus hold that it does not."""
        for node in self._snapshot.nodes:
            for gs, fake in zip(node.gpus, self.gpus_by_node[node.name], strict=True):
                enforced = fake.enforced_limit_w()
                if enforced != gs.power_limit_w:
                    self.sim.inject("power_cap", node.name, gpu=gs.index, limit_w=enforced)

    def _publish(self) -> RackSnapshot:
        snap = self.sim.snapshot()
        for node in snap.nodes:
            apply_node(node, self.gpus_by_node[node.name])
        return snap
