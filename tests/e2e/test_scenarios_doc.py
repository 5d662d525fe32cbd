"""docs/scenarios.md: every command of its game day, taken from the markdown and run in order.

The ```sh blocks are joined into one bash script (``set -euo pipefail``) run in
an empty directory with the simulation install on PATH. The fixed ports the
page shows are replaced by free ones; the staging scheduler is the one `serve`
runs (``--scheduler``), whose record of what it applied must hold the drain.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
from pathlib import Path

import orjson
import pytest

from fakes.cdu_server import free_port
from fakes.sim.scenario import _EVENT_SPECS, EventKind
from fakes.snmp_recording import free_udp_port
from tests.support.paths import ROOT

pytestmark = pytest.mark.scenario

DOC = ROOT / "docs" / "scenarios.md"
FENCE = re.compile(r"^```sh\n(.*?)^```", re.DOTALL | re.MULTILINE)
TCP_PORTS = ("14840", "18790", "19100", "19200")
UDP_PORTS = ("16161",)


def doc_script() -> str:
    """The page's shell blocks, in order."""
    blocks = FENCE.findall(DOC.read_text(encoding="utf-8"))
    assert len(blocks) >= 6, "docs/scenarios.md lost its game-day commands"
    return "\n".join(blocks)


def test_the_page_documents_every_event_kind_and_parameter() -> None:
    text = DOC.read_text(encoding="utf-8")
    for kind in EventKind:
        row = next((line for line in text.splitlines() if line.startswith(f"| `{kind}`")), None)
        assert row is not None, f"{kind} is not in the event table"
        for param in _EVENT_SPECS[kind][1]:
            assert f"`{param}`" in row, f"{kind}.{param} is not documented"


async def test_every_command_of_the_game_day_runs(tmp_path: Path) -> None:
    script = doc_script()
    ports = {p: str(free_port()) for p in TCP_PORTS} | {p: str(free_udp_port()) for p in UDP_PORTS}
    for fixed, free in ports.items():
        assert fixed in script
        script = script.replace(fixed, free)
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(ROOT),
    }
    (tmp_path / "game-day.sh").write_text(
        "set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n" + script
    )
    proc = await asyncio.create_subprocess_exec(
        "bash",
        "game-day.sh",
        cwd=tmp_path,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout=400)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    text = out.decode(errors="replace")
    logs = "".join(
        f"\n--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
        for p in (tmp_path / "serve.log", tmp_path / "daemon.log")
        if p.exists()
    )
    assert proc.returncode == 0, text + logs
    # Step 1: the broken file is refused naming the key.
    assert "broken.toml: events[1].residual_flow_pct: must be at most 100, got 300" in text
    # Step 2 and 6: the replay and the live run both pass their score.
    assert text.count("outcome                            PASS") == 2, text
    # Step 5: an unknown fault lists the known ones.
    assert "unknown fault 'pump_explode' (known: pump_fail," in text
    # The live score was judged on what serve's scheduler applied, and it holds the drain.
    assert f"judged on what the scheduler at http://127.0.0.1:{ports['19200']}/rackguard" in text
    run = orjson.loads((tmp_path / "sim" / "run.json").read_bytes())
    assert run["scheduler"]["rejected_signatures"] == 0
    assert any(
        a["node"] == "stage-01" and a["action"] in ("drain", "exclude") for a in run["applied"]
    )
    assert '"fault": "sensor_stick"' in (tmp_path / "what-happened.json").read_text()
