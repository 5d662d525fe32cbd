"""Whole-stack runs: simulator -> fake NVML -> real daemons -> webhook -> fake scheduler."""

from __future__ import annotations

import io
from dataclasses import replace

import pytest

from fakes.demo import run_scenario, summary, to_sim_time
from fakes.sim import load_scenario

pytestmark = pytest.mark.scenario


async def test_hot_gpu_drains_only_its_node_before_slowdown_and_resumes_it_repaired() -> None:
    # One run for both halves of the story (a whole stack in real time costs a minute).
    # Repaired at t=720 s: GPU 3 is back under the exit margin by ~760 s, and its
    # full-load estimate follows the repair as it cools (an upper bound on its thermal
    # resistance). Healthy for resume_after (120 s here), it resumes at ~890 s: the
    # shipped 900 s leave ~10 s, which one stale poll on a loaded machine takes, so the
    # run is given three more minutes. x16: the fastest the demo plays (it lowers more);
    # GPU poll timeouts of 0.05 s, which a busy host meets (slower is marked invalid).
    scenario = replace(load_scenario("hot-gpu"), duration_s=1080.0)
    result = await run_scenario(scenario, speed=16, seed=7, out=io.StringIO())
    assert result.acted_nodes == {"gpu-node-02"}
    drain = result.first_action("gpu-node-02")
    assert drain is not None and drain.action == "drain"
    assert drain.reason.startswith("rackguard: gpu3 ") and "near slowdown 90C" in drain.reason
    assert drain.domain == "gpu"
    assert result.first_crossing is not None
    crossing_t, node, gpu = result.first_crossing
    assert (node, gpu) == ("gpu-node-02", 3)
    assert drain.t < crossing_t - 30  # drained well before the GPU throttles
    assert result.as_expected
    # A machine too busy for x16 (the loop stalled, a GPU poll timed out) is said, not hidden.
    verdict = "outcome INVALID (" if result.invalid else "outcome as expected"
    assert verdict in summary(result)
    # Every agent polled its GPUs, the rack's PDU over SNMP and the CDU over OPC-UA.
    assert result.source_health == {
        n: {"gpus": "up", "pdu": "up", "cdu": "up"}
        for n in ("gpu-node-01", "gpu-node-02", "gpu-node-03", "gpu-node-04")
    }
    # Repaired: excluded at the crossing, then back in service by the end.
    assert [d.action for d in result.decisions] == ["drain", "exclude", "resume"]
    assert result.decisions[-1].t > 720.0
    assert result.final_state == {"gpu-node-02": "idle"}


async def test_sensor_dropout_is_unknown_never_a_drain() -> None:
    out = io.StringIO()
    result = await run_scenario("sensor-dropout", speed=16, seed=1, out=out)
    assert result.decisions == []
    log = out.getvalue()
    assert "gpu-node-03  condition unknown" in log  # the dropout is visible
    assert "NVML_ERROR_UNKNOWN" in log
    assert result.as_expected


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        (
            "rackguard: gpu3 72C, +41.1C/min: near slowdown 90C in ~26s",
            "rackguard: gpu3 72C, +2.7C/min: near slowdown 90C in ~6 min",
        ),
        ("slowdown in ~4s (3s to 5s at 90%)", "slowdown in ~60s (45s to 75s at 90%)"),
        (
            "rackguard: gpu3 90C at or above slowdown 90C",
            "rackguard: gpu3 90C at or above slowdown 90C",
        ),
    ],
)
def test_demo_shows_agent_rates_in_simulated_time(reason: str, expected: str) -> None:
    assert to_sim_time(reason, 15.0) == expected
