"""A staging game day: `rackguard-sim serve` with a user's scenario, a real `rackguard run` on it.

The daemon runs as its own process with an ordinary config file (no simulation
setting in it), started by `rackguard-sim node`: GPUs through the fake NVML
reading the node file serve publishes, the PDU over SNMP, the CDU over
OPC-UA, decisions to a webhook receiver (fakes/scheduler.py). A pump failure is
injected through the control API; the drain must reach the receiver, and
`rackguard-sim score` on the daemon's /v1/decisions must pass.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from fakes.cdu_server import free_port
from fakes.processes import stop_process
from fakes.scheduler import FakeWebhookScheduler
from fakes.snmp_recording import free_udp_port
from tests.support.paths import ROOT
from tests.support.secrets import WEBHOOK_SECRET, write_secret
from tests.support.wait import wait_for_result, wait_until

pytestmark = pytest.mark.scenario

SPEED = 4.0  # simulated seconds per wall second; the daemon's time settings are divided by it
SCENARIO = """
name = "staging-gameday"
description = "One staging node trains; the game day fails the CDU pump by hand."
duration_s = 1800
seed = 5

[rack]
nodes = ["stage-01"]
gpus_per_node = 4

[[events]]
at_s = 0
kind = "job_start"
target = "rack"
util = 0.9

[expect]
drained_nodes = ["stage-01"]
"""


def daemon_config(api_port: int, run: dict[str, Any], url: str, tmp: Path) -> str:
    """An ordinary node config; time settings divided by SPEED (see docs/scenarios.md)."""
    ep = run["endpoints"]
    probes = ", ".join(f'"{k}" = "{v}"' for k, v in ep["pdu"]["probe_positions"].items())
    s = SPEED
    return f"""
[node]
name = "stage-01"
rack = "staging-rack"
[api]
port = {api_port}
[sources.gpus]
type = "nvml"
interval_s = {1.0 / s}
timeout_s = {0.8 / s}
[sources.pdu]
type = "snmp"
host = "{ep["pdu"]["host"]}"
port = {ep["pdu"]["port"]}
version = "2c"
community_file = "{tmp / "community"}"
profile = "{ep["pdu"]["profile"]}"
probe_positions = {{ {probes} }}
interval_s = 0.5
timeout_s = 0.4
request_timeout_s = 0.3
poll_deadline_s = 0.35
retries = 0
[sources.cdu]
type = "opcua"
url = "{ep["cdu"]["url"]}"
profile = "{ep["cdu"]["profile"]}"
interval_s = 0.5
timeout_s = 0.45
sampling_interval_s = 0.25
keepalive_s = 1.0
stale_after_s = 3.0
bad_after_s = 6.0
[policy]
min_dwell_s = {60 / s}
resume_after_s = {300 / s}
stale_after_s = {5 / s}
evaluate_interval_s = {1 / s}
rack_stale_after_s = {30 / s}
lead_time_s = {600 / s}
trend_window_s = {300 / s}
trend_bucket_s = {10 / s}
skill_horizon_s = {60 / s}
load_settle_s = {120 / s}
max_gpu_rate_c_per_min = {10 * s}
max_air_rate_c_per_min = {5 * s}
storm_window_s = {600 / s}
resume_window_s = {60 / s}
[scheduler]
type = "webhook"
url = "{url}"
secret_file = "{tmp / "webhook.key"}"
retry_initial_s = 0.2
retry_max_s = 1.0
outbox_path = "{tmp / "outbox.sqlite3"}"
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in reversed(started):
        stop_process(p)


def _spawn(
    procs: list[subprocess.Popen[bytes]], args: list[str], log: Path, **env: str
) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        p = subprocess.Popen(
            [sys.executable, *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**_env(), **env},
        )
    procs.append(p)
    return p


async def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m MODULE ARGS`` to its end, off the event loop."""
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
        check=False,
    )


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int, dict[str, Any]]:
    try:
        async with session.get(url) as rsp:
            return rsp.status, orjson.loads(await rsp.read())
    except aiohttp.ClientError:
        return 0, {}


async def test_game_day_pump_failure_drains_and_scores(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    scenario = tmp_path / "gameday.toml"
    scenario.write_text(SCENARIO)
    write_secret(tmp_path / "community", "staging\n")
    write_secret(tmp_path / "webhook.key", WEBHOOK_SECRET)
    state = tmp_path / "sim"
    control = f"127.0.0.1:{free_port()}"
    serve_log = tmp_path / "serve.log"
    serve = _spawn(
        procs,
        [
            "-m", "fakes.sim.cli", "serve", str(scenario), "--state-dir", str(state),
            "--speed", str(SPEED), "--pdu", f"127.0.0.1:{free_udp_port()}",
            "--pdu-profile", "raritan-px2", "--community-file", str(tmp_path / "community"),
            "--cdu", f"127.0.0.1:{free_port()}", "--control", control,
        ],
        serve_log,
    )  # fmt: skip
    receiver = FakeWebhookScheduler(WEBHOOK_SECRET)
    url = await receiver.start()
    try:
        async with aiohttp.ClientSession() as http:
            _, run = await wait_for_result(
                lambda: _get(http, f"http://{control}/v1/status"),
                lambda r: r[0] == 200 or serve.poll() is not None,
                timeout=60,
                what="serve's control API",
            )
            assert serve.poll() is None, serve_log.read_text()
            api_port = free_port()
            config = tmp_path / "rackguard.toml"
            config.write_text(daemon_config(api_port, run, url, tmp_path))
            check = await _cli("daemon.cli", "check-config", str(config))
            assert check.returncode == 0, check.stdout + check.stderr
            daemon_log = tmp_path / "daemon.log"
            gpus = str(state / "gpus" / "stage-01.json")
            daemon = _spawn(
                procs,
                [
                    "-m",
                    "fakes.sim.cli",
                    "node",
                    "--gpus",
                    gpus,
                    "--",
                    "run",
                    "--config",
                    str(config),
                ],
                daemon_log,
            )
            api = f"http://127.0.0.1:{api_port}"
            await wait_for_result(
                lambda: _get(http, f"{api}/readyz"),
                lambda r: r[0] == 200 or daemon.poll() is not None,
                timeout=60,
                what="the daemon's sources all reporting",
            )
            assert daemon.poll() is None, daemon_log.read_text()
            _, body = await _get(http, f"{api}/v1/state")
            assert {n: s["health"] for n, s in body["sources"].items()} == {
                "gpus": "up",
                "pdu": "up",
                "cdu": "up",
            }
            assert receiver.received == []  # nothing to drain while the loop is healthy

            async with http.post(
                f"http://{control}/v1/faults/pump_fail", json={"residual_flow_pct": 3}
            ) as rsp:
                assert rsp.status == 200, await rsp.text()
                fault = orjson.loads(await rsp.read())
            assert fault["fault"] == "pump_fail"

            await wait_until(
                lambda: any(r.payload["action"] != "resume" for r in receiver.received),
                timeout=120,
                what="a drain at the receiver",
                interval=0.1,
            )
            drain = receiver.received[0].payload
            assert drain["node"] == "stage-01"
            assert drain["action"] in ("drain", "exclude")
            _, status = await _get(http, f"http://{control}/v1/status")
            assert [f["fault"] for f in status["faults"]] == ["pump_fail"]

        run_record = str(state / "run.json")
        decisions = f"{api}/v1/decisions"
        scored = await _cli(
            "fakes.sim.cli", "score", str(scenario), decisions, "--run", run_record, "--wait", "30"
        )
        assert scored.returncode == 0, scored.stdout + scored.stderr
        assert "outcome                            PASS" in scored.stdout
        assert "false drains                       0" in scored.stdout
        assert "stage-01 drained at" in scored.stdout
        # The same log scored from the outbox file gives the same verdict.
        outbox = str(tmp_path / "outbox.sqlite3")
        from_outbox = await _cli(
            "fakes.sim.cli", "score", str(scenario), outbox, "--run", run_record
        )
        assert from_outbox.returncode == 0, from_outbox.stdout + from_outbox.stderr
    finally:
        await receiver.stop()
