"""Replay prints the recorded bytes on every scenario trace and on the real GPU traces."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from daemon.replay.command import run_replay
from fakes.sim import list_scenarios
from fakes.sim.trace_writer import write_trace
from tests.daemon.replay.golden_traces import (
    GOLDEN,
    load_digests,
    real_recordings,
    scenario_recording,
)

RERECORD = "re-record with `.venv/bin/python -m tests.daemon.replay.golden_traces` if meant"


def test_every_scenario_has_a_recording() -> None:
    assert set(list_scenarios()) <= set(load_digests())


@pytest.mark.parametrize("name", list_scenarios())
def test_scenario_replays_to_the_recorded_bytes(name: str, tmp_path: Path) -> None:
    want = load_digests()[name]
    got = scenario_recording(name, tmp_path)
    assert got.trace_sha256 == want["trace_sha256"], f"{name}: the trace writer's bytes changed"
    assert got.output == (GOLDEN / f"{name}.jsonl").read_text(encoding="utf-8"), (
        f"{name}: replay printed other decisions; {RERECORD}"
    )
    assert got.outcomes_sha256 == want["outcomes_sha256"], (
        f"{name}: some assessment changed; {RERECORD}"
    )


def test_the_replay_command_prints_the_recorded_bytes(tmp_path: Path) -> None:
    trace = tmp_path / "pump-failure.jsonl"
    with trace.open("w", encoding="utf-8") as f:
        write_trace("pump-failure", f)
    out, err = io.StringIO(), io.StringIO()
    assert run_replay(trace, None, out=out, err=err) == 0, err.getvalue()
    want = (GOLDEN / "pump-failure.jsonl").read_bytes()
    assert want, "the recording holds decisions to compare"
    assert out.getvalue().encode() == want


def test_real_gpu_traces_replay_to_the_recorded_bytes() -> None:
    recordings = list(real_recordings())
    if not recordings:
        pytest.skip("../shared/data/gpu absent: no real GPU traces to replay")
    digests = load_digests()
    for name, got in recordings:
        assert got.output == (GOLDEN / f"{name}.jsonl").read_text(encoding="utf-8"), name
        assert got.outcomes_sha256 == digests[name]["outcomes_sha256"], f"{name}: {RERECORD}"
