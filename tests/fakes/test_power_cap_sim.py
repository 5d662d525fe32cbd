"""The simulator follows a limit set through the fake NVML: draw, heat and throughput."""

from __future__ import annotations

import math

import pytest

from adapters.sensors.power_limit import DirectNvmlLimiter
from fakes.nvml import FakeNvml
from fakes.sim.nvml_bridge import SimulatedRack
from fakes.sim.scenario import load_scenario
from fakes.sim.throughput import ALPHA, throughput_fraction

NODE = "gpu-node-02"


def test_power_cap_throughput_model() -> None:
    assert throughput_fraction(400.0, 300.0) == 1.0  # the cap does not bind
    assert throughput_fraction(350.0, 700.0) == pytest.approx(0.5**ALPHA)
    assert 0.74 < throughput_fraction(350.0, 700.0) < 0.77  # half the power, ~3/4 the work
    assert throughput_fraction(0.0, 700.0) == 0.0
    assert throughput_fraction(100.0, 0.0) == 1.0
    assert 0.3 <= ALPHA <= 0.5


async def test_power_cap_set_through_nvml_drives_the_simulator() -> None:
    rack = SimulatedRack(load_scenario("hot-gpu"))
    rack.advance(120.0)  # training at 90 %: ~637 W per GPU
    fake = FakeNvml(rack.gpus_by_node[NODE], privileged=True)
    limiter = DirectNvmlLimiter(fake)
    try:
        before = rack.snapshot.node(NODE).gpus[3]
        assert before.power_w > 600.0 and before.throughput == pytest.approx(1.0)
        after_set = await limiter.set_limit(fake.gpus[3].uuid, 300.0)
        assert after_set.enforced_w == 300.0
        snap = rack.advance(120.0)
        capped = snap.node(NODE).gpus[3]
        assert capped.power_limit_w == 300.0
        assert capped.power_w == pytest.approx(300.0, abs=15.0)  # noise on the snapshot
        assert capped.throughput == pytest.approx((300.0 / 637.0) ** ALPHA, rel=0.02)
        assert capped.temperature_c < before.temperature_c - 10.0  # heating rate ~ P
        neighbour = snap.node(NODE).gpus[2]
        assert neighbour.power_limit_w == 700.0 and neighbour.throughput == 1.0
        (gpu3,) = [g for g in await limiter.limits() if g.index == 3]
        assert (gpu3.requested_w, gpu3.enforced_w) == (300.0, 300.0)  # the step kept it
        await limiter.set_limit(fake.gpus[3].uuid, 700.0)  # restored
        restored = rack.advance(120.0).node(NODE).gpus[3]
        assert restored.power_limit_w == 700.0 and restored.throughput == pytest.approx(1.0)
    finally:
        await limiter.close()


async def test_power_cap_scenario_cap_and_other_actors_show_in_nvml() -> None:
    rack = SimulatedRack(load_scenario("hot-gpu"))
    rack.sim.inject("power_cap", NODE, gpu=1, limit_w=450.0)  # an admin, in the scenario
    rack.advance(1.0)
    fake = FakeNvml(rack.gpus_by_node[NODE], privileged=True)
    limiter = DirectNvmlLimiter(fake)
    try:
        gpu1 = (await limiter.limits())[1]
        assert (gpu1.requested_w, gpu1.enforced_w) == (450.0, 450.0)
        fake.gpus[5].external_limit_w = 500.0  # e.g. the BMC caps GPU 5
        snap = rack.advance(60.0)
        assert snap.node(NODE).gpus[5].power_limit_w == 500.0
        gpu5 = (await limiter.limits())[5]
        assert (gpu5.requested_w, gpu5.enforced_w) == (700.0, 500.0)
        assert math.isclose(snap.node(NODE).gpus[5].power_w, 500.0, abs_tol=15.0)
    finally:
        await limiter.close()
