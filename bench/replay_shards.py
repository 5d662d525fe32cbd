"""A fleet what-if replayed by rack in processes, against the same trace replayed serially.

The fleet: four racks of 4 nodes x 8 GPUs, each a different simulator scenario
(chiller loss, a hot GPU, normal load, a pump blip) run for half an hour on one
clock, each rack's trace written as its rack's recorder would, and the four merged
into one trace (policies/shards.py). Serial: ``rackguard replay``'s code over the
merged trace in one process. Sharded: the same code over each rack's trace, the
racks dealt to ``JOBS`` processes, the decisions merged; byte-identical to the
serial run's (checked at every repeat, and by tests/bench/test_replay_shards.py),
or, where a cluster-wide gate could have acted, replayed serially instead.

Measured: the serial replay's CPU seconds against the sharded run's critical path
on ``JOBS`` free cores: the busiest process's CPU seconds plus the merge's. CPU
time, so a machine shared with other work measures the same; the wall-clock
speedup on this machine, as loaded as it is, is printed beside it. Target: at
least 1.7x on 2 cores. Medians of ``repeats`` runs, each side in fresh processes,
interleaved.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import msgspec

from bench.report import Row, median
from daemon.config.policy import PolicyConfig, policy_settings
from daemon.replay.command import run_replay
from fakes.sim import load_scenario
from fakes.sim.trace_writer import scenario_readings
from policies.model import Reading
from policies.shards import cluster_gates_quiet, merge_decisions, merge_racks
from policies.trace import Header, encode_header, encode_reading, parse_readings

RACKS = ("chiller-loss", "hot-gpu", "normal-load", "pump-blip")
DURATION_S = 1800.0
JOBS = 2
TARGET_SPEEDUP = 1.7


def _relabelled(readings: Iterator[Reading], prefix: str) -> Iterator[Reading]:
    for r in readings:
        node = r.labels.get("node")
        if node is None:
            yield r
        else:
            yield msgspec.structs.replace(r, labels={**r.labels, "node": prefix + node})


def write_fleet(
    folder: Path, racks: Sequence[str] = RACKS, duration_s: float = DURATION_S
) -> tuple[Path, list[Path]]:
    """Each rack's trace and the merged trace in ``folder``: (merged, [rack traces])."""
    paths = []
    for i, name in enumerate(racks):
        scenario = dataclasses.replace(load_scenario(name), duration_s=duration_s)
        rack, prefix = f"rack-{i}", f"r{i}-"
        header, readings = scenario_readings(scenario, rack=rack)
        nodes = tuple(prefix + n for n in header.racks[rack])
        path = folder / f"{rack}.jsonl"
        with path.open("w", encoding="utf-8") as f:
            f.write(encode_header({rack: nodes}, header.meta) + "\n")
            for r in _relabelled(readings, prefix):
                f.write(encode_reading(r) + "\n")
        paths.append(path)
    merged = folder / "fleet.jsonl"
    with contextlib.ExitStack() as stack:
        files = [stack.enter_context(p.open("rb")) for p in paths]
        header, readings = merge_racks([parse_readings(f) for f in files])
        with merged.open("w", encoding="utf-8") as f:
            f.write(encode_header(header.racks) + "\n")
            for r in readings:
                f.write(encode_reading(r) + "\n")
    return merged, paths


def _replay(path: Path) -> str:
    out, err = io.StringIO(), io.StringIO()
    if run_replay(path, None, out=out, err=err) != 0:
        raise RuntimeError(f"replay of {path} failed: {err.getvalue()}")
    return out.getvalue()


def _replay_racks(paths: Sequence[Path]) -> tuple[list[str], float]:
    """One process's share: each rack's decision lines, and the CPU seconds they took."""
    start = time.process_time()
    outputs = [_replay(p) for p in paths]
    return outputs, time.process_time() - start


def replay_sharded(merged: Path, racks: Sequence[Path], jobs: int) -> tuple[str, float]:
    """The merged trace's decision lines, replayed by rack in ``jobs`` processes.

    Returns them with the critical path's CPU seconds (the busiest process's, plus
    the merge's). Where a cluster-wide gate could have acted, the merged trace is
    replayed serially (and the critical path is that replay's).
    """
    shares = [list(racks[i::jobs]) for i in range(jobs)]
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        done = list(pool.map(_replay_racks, shares))
    start = time.process_time()
    with merged.open("rb") as f:
        header = _header(f)
    lines = merge_decisions(header, (out for outputs, _ in done for out in outputs))
    quiet = cluster_gates_quiet(header, lines, policy_settings(PolicyConfig()))
    merge_s = time.process_time() - start
    if not quiet:
        start = time.process_time()
        text = _replay(merged)
        return text, time.process_time() - start
    text = "".join(line + "\n" for line in lines)
    return text, max(cpu for _, cpu in done) + merge_s


def _header(lines: Iterable[bytes]) -> Header:
    header, _ = parse_readings(lines)
    return header


def _child(kind: str, merged: Path, racks: Sequence[Path], out: Path) -> None:
    """One timed run in this process: prints its critical-path CPU and wall seconds."""
    wall = time.perf_counter()
    if kind == "serial":
        start = time.process_time()
        text = _replay(merged)
        cpu = time.process_time() - start
    else:
        text, cpu = replay_sharded(merged, racks, JOBS)
    wall = time.perf_counter() - wall
    out.write_text(text, encoding="utf-8")
    print(f"{cpu:.6f} {wall:.6f}")


def _run_child(kind: str, merged: Path, racks: Sequence[Path], out: Path) -> tuple[float, float]:
    done = subprocess.run(
        [sys.executable, "-m", "bench.replay_shards", "--child", kind, str(out), str(merged)]
        + [str(p) for p in racks],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"replay child failed: {done.stderr[-2000:]}")
    cpu, wall = done.stdout.split()
    return float(cpu), float(wall)


def measure(repeats: int = 3) -> list[Row]:
    """The sharded replay's speedup over the serial one, and whether their bytes agree."""
    with tempfile.TemporaryDirectory(prefix="rg-bench-shards-") as folder:
        merged, racks = write_fleet(Path(folder))
        with merged.open("rb") as f:
            readings = sum(1 for _ in f) - 1
        runs: dict[str, list[tuple[float, float]]] = {"serial": [], "sharded": []}
        same = True
        for k in range(repeats):
            outs = {}
            for kind in ("serial", "sharded"):
                outs[kind] = Path(folder) / f"{kind}-{k}.jsonl"
                runs[kind].append(_run_child(kind, merged, racks, outs[kind]))
            same = same and outs["serial"].read_bytes() == outs["sharded"].read_bytes()
            decisions = outs["serial"].read_bytes().count(b"\n")
    serial = median([c for c, _ in runs["serial"]])
    sharded = median([c for c, _ in runs["sharded"]])
    speedup = median([s[0] / p[0] for s, p in zip(runs["serial"], runs["sharded"], strict=True)])
    wall = median([s[1] / p[1] for s, p in zip(runs["serial"], runs["sharded"], strict=True)])
    load = os.getloadavg()[0]
    trace = f"{len(RACKS)} racks x 4x8 GPUs, {DURATION_S / 60:.0f} min, {readings} readings"
    return [
        Row(
            f"replay sharded by rack, {JOBS} processes ({trace}; {decisions} decisions, "
            f"{'byte-identical' if same else 'DIFFERENT'} to serial)",
            readings / sharded,
            "readings/s",
            "the same replay serially, same run",
            readings / serial,
            target=(
                f">= {TARGET_SPEEDUP}x serial on {JOBS} cores, CPU critical path (now "
                f"{speedup:.2f}x; wall {wall:.2f}x at load {load:.1f})"
            ),
            ok=same and speedup >= TARGET_SPEEDUP,
        )
    ]


def main() -> None:
    """Print this benchmark's rows."""
    from bench.report import render  # noqa: PLC0415

    p = argparse.ArgumentParser(prog="python -m bench.replay_shards")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)  # kind out merged racks...
    args = p.parse_args()
    if args.child is not None:
        kind, out, merged, *racks = args.child
        _child(kind, Path(merged), [Path(r) for r in racks], Path(out))
        return
    print(render(measure(args.repeats)))


if __name__ == "__main__":
    main()
