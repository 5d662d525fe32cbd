"""The trace format, replay and its command, the daemon's recorder and the simulator's writer."""

from __future__ import annotations

import argparse
import gzip
import io
import json
import sys
from pathlib import Path
from types import MappingProxyType

import msgspec
import pytest

from daemon.replay.command import add_parser, run_replay
from daemon.replay.recorder import TraceRecorder
from daemon.service.engine import PolicyEngine
from daemon.service.state import StateStore
from fakes.sim import parse_scenario
from fakes.sim.trace_writer import scenario_readings, write_trace
from policies.model import (
    Action,
    Assessment,
    Condition,
    Decision,
    FaultDomain,
    Quality,
    Reading,
    SensorKind,
)
from policies.replay import decision_lines, replay
from policies.settings import PolicySettings
from policies.trace import (
    TraceError,
    decode_decision,
    decode_reading,
    encode_decision,
    encode_header,
    encode_reading,
    parse,
)
from tests.support.output import into_closed_pipe, into_full_disk

# A small hot-GPU run: two nodes of two GPUs, one cold plate failing.
SMALL = parse_scenario(
    {
        "name": "small-hot-gpu",
        "description": "test",
        "duration_s": 600,
        "seed": 3,
        "rack": {"nodes": ["n1", "n2"], "gpus_per_node": 2},
        "events": [
            {"at_s": 0, "kind": "job_start", "target": "rack", "util": 0.9},
            {
                "at_s": 30,
                "kind": "cold_plate_degrade",
                "target": "n2",
                "gpu": 1,
                "factor": 3.0,
                "ramp_s": 300,
            },
        ],
        "expect": {"drained_nodes": ["n2"]},
    }
)


@pytest.fixture(scope="module")
def trace_text() -> str:
    out = io.StringIO()
    lines = write_trace(SMALL, out)
    text = out.getvalue()
    assert lines == text.count("\n")
    return text


def test_readings_round_trip_exactly() -> None:
    labels = MappingProxyType({"node": "n1", "gpu": "0"})
    for r in (
        Reading("gpus", "gpu0.temperature", SensorKind.GPU_TEMPERATURE, 64.12345678901, "celsius",
                Quality.GOOD, 12.5, 1.7e9 + 0.1, device_ts=1.7e9, labels=labels),
        Reading("gpus", "gpu0.temperature", SensorKind.GPU_TEMPERATURE, None, "celsius",
                Quality.BAD, 13.5, 1.7e9 + 1.1, reason="NVML_ERROR_UNKNOWN: x"),
    ):  # fmt: skip
        assert decode_reading(json.loads(encode_reading(r))) == r


def test_decisions_round_trip_with_their_evidence() -> None:
    a = Assessment("gpu3", FaultDomain.GPU, Condition.WARNING, 5.0, 72.0, "celsius", 90.0, 2.8,
                   360.0, "72C")  # fmt: skip
    d = Decision("n2", Action.DRAIN, "rackguard: x", FaultDomain.GPU, 1.7e9, "rg-1", (a,), True)
    traced = decode_decision(json.loads(encode_decision(d, 42.0)))
    assert traced.decision == d and traced.mono == 42.0


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([], "empty trace"),
        (['{"type": "header", "format": "other", "version": 1}'], "line 1: not a rackguard-trace"),
        ([encode_header({"r": ["n"]}), "{nope"], "line 2: not JSON"),
        ([encode_header({"r": ["n"]}), '{"type": "x"}'], "line 2: unknown record type 'x'"),
        (
            [encode_header({"r": ["n"]}), "", '{"type": "reading", "kind": "gpu_temperature"}'],
            "line 3: Object missing required field `source`",
        ),
        (
            [
                encode_header({"r": ["n"]}),
                json.dumps(
                    {
                        "type": "reading",
                        "source": "s",
                        "sensor": "t",
                        "kind": "gpu_temperature",
                        "value": None,
                        "unit": "c",
                        "quality": "bad",
                        "mono": 1,
                        "wall": 1,
                    }
                ),
            ],
            "line 2: t: a bad reading needs a reason",
        ),
    ],
)
def test_bad_traces_name_the_line(lines: list[str], message: str) -> None:
    with pytest.raises(TraceError, match=message):
        _, records = parse(lines)
        list(records)


def test_simulator_trace_has_every_source(trace_text: str) -> None:
    header, records = parse(trace_text.splitlines())
    assert dict(header.racks) == {"rack-sim": ("n1", "n2")}
    assert header.meta["scenario"] == "small-hot-gpu"
    kinds: dict[SensorKind, set[str]] = {}
    for r in records:
        assert isinstance(r, Reading)
        kinds.setdefault(r.kind, set()).add(r.labels.get("node") or r.labels["rack"])
    assert kinds[SensorKind.GPU_TEMPERATURE] == {"n1", "n2"}
    for k in (
        SensorKind.INLET_TEMPERATURE,
        SensorKind.POWER,
        SensorKind.COOLANT_SUPPLY_TEMPERATURE,
        SensorKind.COOLANT_RETURN_TEMPERATURE,
        SensorKind.COOLANT_FLOW,
        SensorKind.PUMP_STATE,
        SensorKind.LEAK,
    ):
        assert kinds[k] == {"rack-sim"}, k


def test_replay_is_deterministic_and_drains_the_hot_node(trace_text: str) -> None:
    s = PolicySettings()
    first = list(decision_lines(replay(trace_text.splitlines(), s)))
    again = list(decision_lines(replay(io.StringIO(trace_text), s)))
    assert first == again and first
    decisions = [json.loads(line) for line in first]
    assert {d["node"] for d in decisions} == {"n2"}
    assert decisions[0]["action"] == "drain" and decisions[0]["domain"] == "gpu"
    assert decisions[0]["reason"].startswith("rackguard: gpu1 ")


def test_replay_command_reads_policy_from_config_and_gz(tmp_path: Path, trace_text: str) -> None:
    trace = tmp_path / "run.jsonl.gz"
    with gzip.open(trace, "wt", encoding="utf-8") as f:
        f.write(trace_text)
    config = tmp_path / "rackguard.toml"
    # A production config: sources and a scheduler secret replay does not need.
    config.write_text(
        '[node]\nname = "x"\n[sources.gpus]\ntype = "nvml"\n'
        '[scheduler]\ntype = "webhook"\nurl = "http://x"\nsecret_file = "/nonexistent"\n'
        "[policy]\ndry_run = true\nenter_margin_c = 4.0\n"
    )
    p = argparse.ArgumentParser()
    add_parser(p.add_subparsers())
    args = p.parse_args(["replay", str(trace), "--config", str(config)])
    out, err = io.StringIO(), io.StringIO()
    assert run_replay(args.trace, args.config, out=out, err=err) == 0
    decisions = [json.loads(line) for line in out.getvalue().splitlines()]
    assert decisions and all(d["dry_run"] for d in decisions) and err.getvalue() == ""


def test_replay_command_errors(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text("[policy]\nexit_margin_c = 2.0\nlead_time_s = -1\n")
    trace = tmp_path / "t.jsonl"
    trace.write_text(encode_header({"r": ["n"]}) + "\n{broken\n")
    out, err = io.StringIO(), io.StringIO()
    assert run_replay(trace, config, out=out, err=err) == 2
    assert "policy.lead_time_s: must be greater than 0" in err.getvalue()
    err = io.StringIO()
    assert run_replay(trace, None, out=out, err=err) == 1
    assert "line 2: not JSON" in err.getvalue()
    err = io.StringIO()
    assert run_replay(tmp_path / "missing", None, out=out, err=err) == 1
    assert "cannot read trace" in err.getvalue()


def test_replay_names_a_config_that_is_not_utf8(tmp_path: Path, trace_text: str) -> None:
    # The same words as check-config (it was a UnicodeDecodeError traceback).
    config = tmp_path / "latin1.toml"
    config.write_bytes(b"[policy]\n# caf\xe9\nenter_margin_c = 4.0\n")
    trace = tmp_path / "t.jsonl"
    trace.write_text(trace_text)
    out, err = io.StringIO(), io.StringIO()
    assert run_replay(trace, config, out=out, err=err) == 2
    assert "not UTF-8 text (byte 0xe9 on line 2)" in err.getvalue()
    assert out.getvalue() == ""


def test_replay_reads_bytes_as_its_text_and_names_a_line_that_is_not_utf8(
    tmp_path: Path, trace_text: str
) -> None:
    s = PolicySettings()
    as_text = list(decision_lines(replay(trace_text.splitlines(), s)))
    as_bytes = list(decision_lines(replay(io.BytesIO(trace_text.encode()), s)))
    # Windows line ends: JSON takes the \r as blank space, the text reader as a line end.
    crlf = io.BytesIO(trace_text.replace("\n", "\r\n").encode())
    assert as_bytes == as_text == list(decision_lines(replay(crlf, s))) and as_text
    lines = trace_text.encode().splitlines(keepends=True)
    # A Latin-1 byte in a reading's sensor name on line 3, and in a blank-looking line.
    for bad in (lines[2].replace(b'"sensor":"', b'"sensor":"caf\xe9', 1), b" \xff\n"):
        trace = tmp_path / "latin1.jsonl"
        trace.write_bytes(b"".join([*lines[:2], bad, *lines[3:]]))
        out, err = io.StringIO(), io.StringIO()
        assert run_replay(trace, None, out=out, err=err) == 1
        column = bad.index(b"\xe9" if b"\xe9" in bad else b"\xff") + 1
        assert f"line 3: not UTF-8 text (byte 0x{bad[column - 1]:02x} at column {column})" in (
            err.getvalue()
        ), err.getvalue()
    # A gzip file cut short, and one whose data is not deflate: cannot read, exit 1.
    packed = gzip.compress(trace_text.encode())
    for broken in (packed[: len(packed) // 2], packed[:20] + b"\x00" * 64 + packed[84:]):
        trace = tmp_path / "broken.jsonl.gz"
        trace.write_bytes(broken)
        out, err = io.StringIO(), io.StringIO()
        assert run_replay(trace, None, out=out, err=err) == 1
        assert f"rackguard: cannot read trace {trace}:" in err.getvalue(), err.getvalue()


def test_replay_names_an_output_it_cannot_write_and_leaves_quietly_when_its_reader_does(
    tmp_path: Path, trace_text: str
) -> None:
    trace = tmp_path / "small.jsonl"
    trace.write_text(trace_text)
    command = [sys.executable, "-m", "daemon.cli", "replay", str(trace)]
    # A full disk under the output: said as a write error (not "cannot read trace"), exit 1.
    rc, stderr = into_full_disk(command)
    assert rc == 1 and stderr.startswith("rackguard: cannot write decisions: [Errno 28]"), stderr
    assert "Traceback" not in stderr
    # `rackguard replay ... | head`: the reader leaves first; no error, no traceback.
    assert into_closed_pipe(command) == (0, "")


@pytest.mark.parametrize(
    ("interval", "words"),
    [
        (0.0, "must be at least 0.01, got 0.0"),
        (-1.0, "must be at least 0.01"),
        (1e-300, "must be at least 0.01"),  # a step this small would never end
        (float("nan"), "must be a finite number"),
        (float("inf"), "must be a finite number"),
    ],
)
def test_replay_refuses_an_interval_the_config_would(
    tmp_path: Path, trace_text: str, interval: float, words: str
) -> None:
    # --interval has evaluate_interval_s's bounds: a usage error (exit 2), not a
    # traceback or a replay that never ends.
    trace = tmp_path / "t.jsonl"
    trace.write_text(trace_text)
    out, err = io.StringIO(), io.StringIO()
    assert run_replay(trace, None, out=out, err=err, interval_s=interval) == 2
    assert f"rackguard: invalid --interval: {words}" in err.getvalue()
    assert out.getvalue() == ""


def test_replay_refuses_times_too_large_to_step(tmp_path: Path, trace_text: str) -> None:
    # At 1e306 a second rounds away (1e306 + 1.0 == 1e306): every evaluation would be
    # at the same time and the replay would never end (it did, filling memory).
    header, *rest = trace_text.splitlines()
    lines = [header]
    for line in rest[:400]:
        record = json.loads(line)
        record["mono"] += 1e306
        lines.append(json.dumps(record))
    trace = tmp_path / "far.jsonl"
    trace.write_text("\n".join(lines) + "\n")
    out, err = io.StringIO(), io.StringIO()
    assert run_replay(trace, None, out=out, err=err) == 1
    assert "monotonic time 1e+306 is too large to evaluate every 1.0 s" in err.getvalue()


def _poll(t: float, temp: float) -> list[Reading]:
    """One NVML poll of a one-GPU node, as the adapter reports it (no node label)."""
    labels = MappingProxyType({"gpu": "0", "uuid": "GPU-x"})
    return [
        Reading(
            "gpus", f"gpu0.{name}", kind, value, "celsius", Quality.GOOD, t, 1e9 + t, labels=labels
        )
        for name, kind, value in (
            ("temperature", SensorKind.GPU_TEMPERATURE, temp),
            ("slowdown_threshold", SensorKind.GPU_SLOWDOWN_THRESHOLD, 90.0),
        )
    ]


def test_recorded_daemon_readings_replay_to_the_daemons_decisions(tmp_path: Path) -> None:
    path = tmp_path / "rec" / "trace.jsonl"
    rec = TraceRecorder(path, "gpu-node-07", "rack-b")
    store = StateStore()
    decided: list[Decision] = []
    settings = PolicySettings(min_dwell_s=0.0, resume_after_s=5.0, resume_jitter=0.0)
    engine = PolicyEngine("gpu-node-07", settings, store, decided.append, rack="rack-b")
    for k in range(40):
        poll = _poll(float(k), 88.0 if 10 <= k < 20 else 60.0)
        store.update("gpus", poll)
        rec.record("gpus", poll)
        engine.evaluate_once(float(k), 1e9 + k)
    rec.close()
    assert [d.action for d in decided] == [Action.DRAIN, Action.RESUME]
    config = tmp_path / "policy.toml"
    config.write_text("[policy]\nmin_dwell_s = 0.0\nresume_after_s = 5.0\nresume_jitter = 0.0\n")
    out, err = io.StringIO(), io.StringIO()
    assert run_replay(path, config, out=out, err=err) == 0, err.getvalue()
    replayed = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(d["node"], d["action"], d["reason"]) for d in replayed] == [
        (d.node, d.action.value, d.reason) for d in decided
    ]


def test_recorder_labels_a_reading_and_keeps_its_timestamps(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    rec = TraceRecorder(path, "n", "rack-b")
    coolant = Reading("cdu", "supply", SensorKind.COOLANT_SUPPLY_TEMPERATURE, 18.5, "celsius",
                      Quality.GOOD, 3.0, 1e9 + 3, device_ts=1e9 + 2.5, server_ts=1e9 + 2.75,
                      labels=MappingProxyType({"variable": "supply"}))  # fmt: skip
    rec.record("cdu", [coolant])
    rec.close()
    _, records = parse(path.read_text().splitlines())
    (got,) = list(records)
    assert isinstance(got, Reading)
    assert got == msgspec.structs.replace(coolant, labels={"variable": "supply", "rack": "rack-b"})


def test_recorder_rotates_and_restarts_with_a_header(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    rec = TraceRecorder(path, "n", "r", max_bytes=2000)
    rotated = path.with_name("trace.jsonl.1")
    k = 0
    while not rotated.exists():
        rec.record("gpus", _poll(float(k), 60.0))
        k += 1
    assert 2 < k < 20
    rec.record("gpus", _poll(float(k), 60.0))
    rec.close()
    assert rotated.exists() and path.exists()
    for p in (rotated, path):
        header, records = parse(p.read_text().splitlines())
        assert dict(header.racks) == {"r": ("n",)}
        assert all(isinstance(r, Reading) and r.labels["node"] == "n" for r in records)


def test_recorder_stops_on_a_failing_disk_without_raising(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    rec = TraceRecorder(blocker / "trace.jsonl", "n", "r")  # a file where a folder must be
    rec.record("gpus", _poll(0.0, 60.0))
    assert rec.failed


def test_engine_keeps_node_state_across_new_settings() -> None:
    store = StateStore()
    decided: list[Decision] = []
    engine = PolicyEngine("n", PolicySettings(), store, decided.append)
    store.update("gpus", _poll(0.0, 87.0))
    engine.evaluate_once(0.0, 1e9)
    assert engine.state.action is Action.DRAIN and engine.last is not None
    engine.settings = PolicySettings(trend_window_s=600.0, resume_after_s=1.0)
    assert engine.settings.trend_window_s == 600.0
    assert engine.state.action is Action.DRAIN  # windows start afresh, decisions stay
    assert engine.last.node.condition is Condition.WARNING


def test_scenario_readings_are_deterministic() -> None:
    _, a = scenario_readings(SMALL, rack_interval_s=10.0)
    _, b = scenario_readings(SMALL, rack_interval_s=10.0)
    assert list(a) == list(b)
