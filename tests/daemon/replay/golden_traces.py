"""Recorded replay outputs: every simulator scenario (and the real GPU traces) through replay.

Each scenario is written as a trace file by the simulator's trace writer, read
back by ``rackguard replay``'s reader and replayed under the default policy. The
recording keeps, per trace: the exact bytes replay prints (``<name>.jsonl``), and
in ``digests.json`` the SHA-256 of the trace file and of every evaluation's
outcome (each node's, GPU's and rack's assessment, the note, the decision), so a
change that moves any assessment, not only a decision, shows.

A change meant to alter decisions re-records them with
``.venv/bin/python -m tests.daemon.replay.golden_traces`` and says so in its commit.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.scoring import real_traces
from fakes.sim import list_scenarios
from fakes.sim.trace_writer import write_trace
from policies.model import Assessment
from policies.replay import Tick, decision_lines, replay, replay_readings
from policies.settings import PolicySettings

GOLDEN = Path(__file__).resolve().parent / "golden"
DIGESTS = GOLDEN / "digests.json"


@dataclass(frozen=True, slots=True)
class Recording:
    """What one trace's replay gave."""

    trace_sha256: str
    outcomes_sha256: str
    output: str


def _assessment(a: Assessment | None) -> list[Any] | None:
    if a is None:
        return None
    return [
        a.subject,
        a.domain.value,
        a.condition.value,
        a.at,
        a.value,
        a.unit,
        a.threshold,
        a.trend_per_min,
        a.time_to_threshold_s,
        a.detail,
    ]


def _record(ticks: Iterable[Tick], trace_sha256: str) -> Recording:
    digest = hashlib.sha256()

    def tee() -> Iterator[Tick]:
        for t in ticks:
            for node, o in t.outcomes.items():
                row = [
                    t.now,
                    t.wall,
                    node,
                    _assessment(o.node),
                    [_assessment(g) for g in o.gpus],
                    _assessment(o.rack),
                    o.note,
                    o.critical,
                    o.following,
                ]
                digest.update(json.dumps(row).encode() + b"\n")
            yield t

    output = "".join(line + "\n" for line in decision_lines(tee()))
    return Recording(trace_sha256, digest.hexdigest(), output)


def scenario_recording(name: str, directory: Path) -> Recording:
    """Write scenario ``name`` as a trace under ``directory`` and replay the file."""
    path = directory / f"{name}.jsonl"
    with path.open("w", encoding="utf-8") as f:
        write_trace(name, f)
    trace_sha = hashlib.sha256(path.read_bytes()).hexdigest()
    try:
        with path.open(encoding="utf-8") as f:
            return _record(replay(f, PolicySettings()), trace_sha)
    finally:
        path.unlink()


def real_recordings() -> Iterator[tuple[str, Recording]]:
    """The real nvidia-smi traces of ../shared/data/gpu present here, as the bench replays them."""
    for name, header, readings in real_traces():
        ticks = replay_readings(header, readings, PolicySettings())
        yield f"real-{Path(name).stem}", _record(ticks, "")


def load_digests() -> dict[str, dict[str, str]]:
    """The recorded digests, by trace name."""
    data: dict[str, dict[str, str]] = json.loads(DIGESTS.read_text(encoding="utf-8"))
    return data


def main() -> None:
    """Re-record every trace (a change meant to alter decisions does this)."""
    digests: dict[str, dict[str, str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        recordings = [(n, scenario_recording(n, Path(tmp))) for n in list_scenarios()]
    recordings += list(real_recordings())
    for name, rec in recordings:
        (GOLDEN / f"{name}.jsonl").write_text(rec.output, encoding="utf-8")
        digests[name] = {"trace_sha256": rec.trace_sha256, "outcomes_sha256": rec.outcomes_sha256}
        print(f"{name}: {rec.output.count(chr(10))} decisions")
    DIGESTS.write_text(json.dumps(digests, indent=2, sort_keys=True) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
