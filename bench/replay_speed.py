"""`rackguard replay` throughput on a fleet-sized trace, against orjson parsing the same file.

The trace: the chiller-loss scenario (4 nodes x 8 GPUs, 1 s GPU readings, 5 s
PDU/CDU readings) run for one hour by the simulator and written by the trace
writer. Measured: the replay command over the file (read, decode, the policy
evaluating every node every second, the decision lines written to a null sink),
in readings per second; reference: ``orjson.loads`` of every line of the same
file, in lines per second, in the same run. Target: replay within 3x the parse
time. CPU time of this process (both are single-threaded), so a machine shared
with other work measures the same; median of ``repeats`` runs of each, interleaved.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import tempfile
import time
from pathlib import Path

import orjson

from bench.report import Row, median
from daemon.replay.command import run_replay
from fakes.sim import load_scenario
from fakes.sim.trace_writer import write_trace

SCENARIO = "chiller-loss"
DURATION_S = 3600.0
TARGET_RATIO = 3.0  # replay time / parse time


def write_fleet_trace(path: Path) -> int:
    """The one-hour 4 x 8 trace at ``path``; returns its reading count (lines less the header)."""
    scenario = dataclasses.replace(load_scenario(SCENARIO), duration_s=DURATION_S)
    with path.open("w", encoding="utf-8") as f:
        return write_trace(scenario, f) - 1


def _parse_s(path: Path) -> float:
    start = time.process_time()
    with path.open("rb") as f:
        for line in f:
            orjson.loads(line)
    return time.process_time() - start


def _replay_s(path: Path) -> float:
    out, err = io.StringIO(), io.StringIO()
    start = time.process_time()
    rc = run_replay(path, None, out=out, err=err)
    elapsed = time.process_time() - start
    if rc != 0:
        raise RuntimeError(f"replay failed: {err.getvalue()}")
    return elapsed


def measure(repeats: int = 3) -> list[Row]:
    """Replay and parse rates over one freshly written trace."""
    with tempfile.TemporaryDirectory(prefix="rg-bench-replay-") as folder:
        path = Path(folder) / "fleet.jsonl"
        readings = write_fleet_trace(path)
        parse, replay = [], []
        for _ in range(repeats):
            parse.append(_parse_s(path))
            replay.append(_replay_s(path))
    parse_s, replay_s = median(parse), median(replay)
    ratio = replay_s / parse_s
    return [
        Row(
            f"replay readings/s (4x8 GPUs, 1 h {SCENARIO} trace, {readings} readings)",
            readings / replay_s,
            "readings/s",
            "orjson.loads of each line",
            readings / parse_s,
            target=f"replay <= {TARGET_RATIO:.0f}x parse time (now {ratio:.2f}x)",
            ok=ratio <= TARGET_RATIO,
        )
    ]


def main() -> None:
    """Print this benchmark's rows."""
    from bench.report import render  # noqa: PLC0415

    p = argparse.ArgumentParser(prog="python -m bench.replay_speed")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    print(render(measure(args.repeats)))


if __name__ == "__main__":
    main()
