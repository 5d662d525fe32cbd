"""`rackguard-sim` without a running rack: scenario errors, decision logs, scoring, traces."""

from __future__ import annotations

import io
import sqlite3
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from fakes.sim.cli import main, score
from fakes.sim.decision_logs import LogError, read_file
from fakes.sim.faults import FAULTS, coerce
from fakes.sim.scenario import load_scenario
from fakes.sim.scoring import first_crossing, throttled_in_service
from fakes.sim.served_gpus import ServedNvml
from fakes.sim.trace_writer import WALL_EPOCH, scenario_readings
from tests.support.output import into_closed_pipe, into_full_disk
from tests.support.paths import ROOT

GOOD = """
name = "mine"
description = "A user's own scenario."
duration_s = 300
[rack]
nodes = ["n1", "n2"]
gpus_per_node = 2
[[events]]
at_s = 0
kind = "job_start"
target = "rack"
[[events]]
at_s = 60
kind = "pump_fail"
[expect]
drained_nodes = ["n1", "n2"]
"""


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (('kind = "pump_fail"', 'kind = "pump_explode"'), "events[1].kind: unknown event kind"),
        (("gpus_per_node = 2", 'gpus_per_node = "two"'), "rack.gpus_per_node: must be an integer"),
        (('drained_nodes = ["n1", "n2"]', 'drained_nodes = ["n9"]'), "names unknown node 'n9'"),
        (("duration_s = 300", "duration_s = 300\nspeed = 4"), "speed: unknown key"),
        (("at_s = 60", "at_s = 900"), "events[1].at_s: is after the end of the run (300 s)"),
        (("[expect]", "[expect"), "not valid TOML"),
    ],
)
@pytest.mark.parametrize("verb", ["check", "trace", "serve", "score"])
def test_a_broken_scenario_file_is_refused_naming_file_and_key(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    verb: str,
    edit: tuple[str, str],
    message: str,
) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(GOOD.replace(*edit))
    extra = {"serve": ["--state-dir", str(tmp_path / "s")], "score": [str(tmp_path / "log")]}
    assert main([verb, str(path), *extra.get(verb, [])]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"rackguard-sim: {path.name}: ")
    assert message in err
    assert "Traceback" not in err
    assert not (tmp_path / "s").exists()  # serve started nothing


def test_demo_refuses_a_broken_scenario_file_naming_the_key(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(GOOD.replace("residual", "x").replace('kind = "pump_fail"', "kind = 3"))
    proc = subprocess.run(
        [sys.executable, "-m", "fakes.sim.cli", "demo", "--scenario", str(path), "--no-live"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 2
    assert f"{path.name}: events[1].kind: must be a string, got integer 3" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_check_summarises_a_good_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(GOOD)
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    assert "ok: scenario mine, 300 s, 2 nodes x 2 h100-sxm, 2 events" in out


def _decision(at: float, node: str, action: str) -> dict[str, object]:
    return {"type": "decision", "at": at, "node": node, "action": action, "reason": "r"}


def test_decision_logs_in_every_form(tmp_path: Path) -> None:
    jsonl = tmp_path / "replayed.jsonl"
    jsonl.write_bytes(
        b"\n".join(orjson.dumps(_decision(t, "n1", a)) for t, a in ((10, "drain"), (50, "resume")))
    )
    assert read_file(jsonl) == [(10.0, "n1", "drain"), (50.0, "n1", "resume")]
    api = tmp_path / "decisions.json"
    api.write_bytes(
        orjson.dumps(
            {
                "items": [
                    {"kind": "override", "at": 5, "node": "n1", "action": "pin"},
                    {"kind": "decision", "at": 7, "node": "n2", "action": "exclude"},
                ],
                "next_cursor": None,
            }
        )
    )
    assert read_file(api) == [(7.0, "n2", "exclude")]
    outbox = tmp_path / "outbox.sqlite3"
    with sqlite3.connect(outbox) as db:
        db.execute("CREATE TABLE decisions (queued_at REAL, node TEXT, action TEXT)")
        db.execute("INSERT INTO decisions VALUES (3.5, 'n1', 'drain')")
    assert read_file(outbox) == [(3.5, "n1", "drain")]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"type":"decision","node":"n1"}', "a decision needs at, node and action"),
        (b"{\n[", "line 1: not JSON"),
        (b'{"items": 3}', "expected a /v1/decisions body"),
        (b"SQLite format 3\x00garbage", "not a rackguard outbox"),
    ],
)
def test_a_bad_decision_log_is_refused_naming_it(
    tmp_path: Path, content: bytes, message: str
) -> None:
    path = tmp_path / "log"
    path.write_bytes(content)
    with pytest.raises(LogError, match="log") as err:
        read_file(path)
    assert message in str(err.value)


def test_score_on_the_serve_clock_counts_leads_and_false_drains(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(GOOD)
    sc = load_scenario(str(path))
    run = {
        "wall_start": 1000.0,
        "speed": 4.0,
        "faults": [
            {"t": 40.0, "fault": "sensor_stick", "target": "gpu"},  # a device's answers
            {"t": 50.0, "fault": "inlet_ramp", "target": "simulator"},  # the rack itself
        ],
        "first_crossing": {"t": 120.0, "node": "n1", "gpu": 0},
    }
    # Wall 1020 and 1025 are t = 80 and 100 on a x4 clock: both before the crossing at 120.
    good = score(sc, [(1020.0, "n1", "drain"), (1025.0, "n2", "exclude")], run)
    assert good.passed and good.lead_s == 20.0 and good.onset_s == 50.0
    late = score(sc, [(1020.0, "n1", "drain"), (1040.0, "n2", "drain")], run)
    assert not late.passed and late.lead_s == -40.0
    missed = score(sc, [(1020.0, "n1", "drain")], run)
    assert not missed.passed and missed.missed == ("n2",)
    assert "n2 expected drained: NEVER" in "\n".join(missed.lines())


def test_score_without_a_run_uses_the_trace_clock(tmp_path: Path) -> None:
    path = tmp_path / "quiet.toml"
    path.write_text(
        GOOD.replace('drained_nodes = ["n1", "n2"]', "").replace("pump_fail", "pump_restore")
    )
    sc = load_scenario(str(path))
    false = score(sc, [(WALL_EPOCH + 30.0, "n2", "drain")], None)
    assert false.crossing_s is None and false.false_drains == 1 and not false.passed
    assert any("(FALSE DRAIN)" in line for line in false.lines())
    assert score(sc, [(WALL_EPOCH + 30.0, "n2", "resume")], None).passed


def test_score_command_exit_status(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(GOOD)
    log = tmp_path / "empty.jsonl"
    log.write_text("")
    assert main(["score", str(path), str(log)]) == 1
    assert "outcome                            FAIL" in capsys.readouterr().out
    assert main(["score", str(path), str(tmp_path / "absent.jsonl")]) == 2
    assert "absent.jsonl" in capsys.readouterr().err


def test_trace_writes_a_replayable_trace(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(GOOD)
    out = io.StringIO()
    from fakes.sim.cli import build_parser, cmd_trace  # noqa: PLC0415

    assert cmd_trace(build_parser().parse_args(["trace", str(path)]), out) == 0
    lines = out.getvalue().splitlines()
    header = orjson.loads(lines[0])
    assert header["type"] == "header" and header["meta"]["scenario"] == "mine"
    assert {orjson.loads(x)["labels"].get("node") for x in lines[1:50]} >= {"n1", "n2"}


def test_trace_into_a_full_disk_or_a_closed_pipe_says_one_line_or_nothing() -> None:
    command = [sys.executable, "-m", "fakes.sim.cli", "trace", "hot-gpu"]
    assert into_full_disk(command) == (1, "rackguard-sim: [Errno 28] No space left on device\n")
    # `rackguard-sim trace ... | head`: the reader leaves; not an error to report.
    assert into_closed_pipe(command) == (1, "")


def test_fault_cli_lists_and_reports_an_absent_harness(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fault", "list"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in FAULTS)
    assert "node=<required>" in listed
    assert main(["fault", "pump_fail", "--control", "127.0.0.1:9"]) == 1
    assert "no harness at http://127.0.0.1:9" in capsys.readouterr().err
    assert main(["fault", "pump_fail", "residual", "--control", "127.0.0.1:9"]) == 2
    assert "parameters are KEY=VALUE" in capsys.readouterr().err


def test_command_line_values_read_as_toml_would() -> None:
    assert [coerce(v) for v in ("true", "3", "2.5", "stage-01")] == [True, 3, 2.5, "stage-01"]


def test_node_injects_the_served_nvml_into_a_daemon_that_takes_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The daemon's CLI with an injected-NVML parameter (the production/simulation split).
    seen: dict[str, object] = {}

    def main_taking_nvml(argv: list[str], *, nvml: object = None) -> int:
        seen.update(argv=argv, nvml=nvml)
        return 0

    monkeypatch.setattr("daemon.cli.main", main_taking_nvml)
    gpus = tmp_path / "n1.json"
    assert main(["node", "--gpus", str(gpus), "--", "probe", "gpus", "--config", "x.toml"]) == 0
    assert seen["argv"] == ["probe", "gpus", "--config", "x.toml"]
    assert isinstance(seen["nvml"], ServedNvml) and seen["nvml"].path == gpus


def test_node_needs_a_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["node", "--gpus", str(tmp_path / "n.json")]) == 2
    assert "give the rackguard command to run" in capsys.readouterr().err


def test_throttled_gpu_seconds_in_service_is_the_scores_outcome_number() -> None:
    sc = load_scenario("pump-failure")
    _, trace = scenario_readings(sc, rack_sources=False)
    readings = list(trace)
    crossing = first_crossing(sc, readings)
    assert crossing is not None
    nodes = sc.rack.nodes
    never = throttled_in_service(sc, readings, {})
    late = throttled_in_service(sc, readings, dict.fromkeys(nodes, crossing + 5.0))
    early = throttled_in_service(sc, readings, dict.fromkeys(nodes, crossing - 1.0))
    assert never > late > 0.0 == early
    assert late >= 5.0  # at least the one GPU at slowdown, for the 5 s it was left at work
    # A drain after the crossing: the replay's score says how long work ran throttled.
    wall = [(WALL_EPOCH + crossing + 5.0, n, "drain") for n in nodes]
    result = score(sc, wall, None)
    line = next(x for x in result.lines() if "throttled GPU-seconds in service" in x)
    assert line.split()[-3] == f"{late:.0f}" and line.endswith("target 0")
