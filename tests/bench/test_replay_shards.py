"""The fleet replay sharded by rack prints the serial replay's bytes, gates quiet or not."""

from __future__ import annotations

from pathlib import Path

from bench.replay_shards import _replay, replay_sharded, write_fleet
from daemon.config.policy import PolicyConfig, policy_settings
from policies.shards import cluster_gates_quiet
from policies.trace import parse_readings


def test_sharded_replay_prints_the_serial_bytes(tmp_path: Path) -> None:
    merged, racks = write_fleet(tmp_path, duration_s=400.0)
    serial = _replay(merged)
    sharded, critical_s = replay_sharded(merged, racks, 2)
    assert serial.count("\n") >= 5, "the fleet makes decisions in more than one rack"
    assert {line.split('"node":"')[1][:2] for line in serial.splitlines()} == {"r0", "r1"}
    assert sharded == serial
    assert critical_s > 0.0


def test_where_the_cluster_budget_could_act_it_replays_serially(tmp_path: Path) -> None:
    # Three racks losing their pumps at once: 12 nodes drained, past the cluster
    # budget of 8, which only the serial replay sees.
    racks = ("pump-failure", "pump-failure-idle-node", "pump-failure-cdu-silent")
    merged, paths = write_fleet(tmp_path, racks, duration_s=200.0)
    serial = _replay(merged)
    with merged.open("rb") as f:
        header, _ = parse_readings(f)
    apart = "".join(_replay(p) for p in paths)
    assert apart.count("\n") > serial.count("\n"), "replayed apart, the budget is not seen"
    assert not cluster_gates_quiet(header, serial.splitlines(), policy_settings(PolicyConfig()))
    sharded, _ = replay_sharded(merged, paths, 2)
    assert sharded == serial
