"""GET /v1/state throughput and p99 against a bare aiohttp handler serving the same bytes.

The daemon is the real `rackguard run` process with a realistic state: 8 GPUs
(fake NVML), 2 PDUs over SNMP and 1 CDU over OPC-UA, their fakes running in a
thread of this process. The reference is a bare aiohttp app on uvloop that
returns the daemon's own /v1/state body, so both answer with the same bytes.
wrk (one thread, 16 connections) loads each in turn, interleaved, medians.
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from bench.report import Row, median

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_http(url: str, proc: subprocess.Popen[bytes], limit_s: float = 30.0) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: server exited")
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url}: not ready in {limit_s}s")


class RackFakes:
    """Two SNMP PDUs and one OPC-UA CDU on loopback, in a thread with its own loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.pdu_ports: list[int] = []
        self.probe_positions: dict[str, str] = {}
        self.cdu_url = ""
        self.cdu_profile = ""
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()
        if not self.ready.wait(60):
            raise RuntimeError("fakes did not start")

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._start())
        self.ready.set()
        self.loop.run_forever()

    async def _start(self) -> None:
        from fakes.cdu_server import FakeCduServer  # noqa: PLC0415 - heavy imports
        from fakes.sim import RackSimulator, load_scenario  # noqa: PLC0415
        from fakes.snmp_agent import SimulatedPdu  # noqa: PLC0415

        sim = RackSimulator(load_scenario("normal-load"), seed=1)
        sim.run_until(300.0)
        snap = sim.snapshot()
        self._pdus = [SimulatedPdu(lambda: snap) for _ in range(2)]
        for pdu in self._pdus:
            await pdu.start()
            self.pdu_ports.append(pdu.port)
        self.probe_positions = dict(self._pdus[0].probe_positions)
        self._cdu = FakeCduServer()
        await self._cdu.start()
        await self._cdu.publish(snap.cdu)
        self.cdu_url = self._cdu.url
        self.cdu_profile = "opc40082-tcd" if self._cdu.model == "tcd" else "generic"

    def stop(self) -> None:
        async def _stop() -> None:
            for pdu in self._pdus:
                await pdu.stop()
            await self._cdu.stop()

        asyncio.run_coroutine_threadsafe(_stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


def _config(port: int, tmp: Path, fakes: RackFakes) -> str:
    (tmp / "key").write_text("bench")
    (tmp / "key").chmod(0o600)
    (tmp / "community").write_text("public")
    (tmp / "community").chmod(0o600)
    probes = ", ".join(f'"{k}" = "{v}"' for k, v in fakes.probe_positions.items())
    pdus = "".join(
        f"""
[sources.pdu-{name}]
type = "snmp"
host = "127.0.0.1"
port = {p}
community_file = "{tmp / "community"}"
probe_positions = {{ {probes} }}
interval_s = 5.0
timeout_s = 2.0
poll_deadline_s = 1.5
"""
        for name, p in zip("ab", fakes.pdu_ports, strict=True)
    )
    return f"""
[node]
name = "bench-node"
[api]
port = {port}
[sources.gpus]
type = "nvml"
{pdus}
[sources.cdu]
type = "opcua"
url = "{fakes.cdu_url}"
profile = "{fakes.cdu_profile}"
[scheduler]
type = "webhook"
url = "http://127.0.0.1:9/unused"
secret_file = "{tmp / "key"}"
outbox_path = "{tmp / "outbox.sqlite3"}"
"""


_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


def _wrk(url: str, seconds: float) -> tuple[float, float]:
    """(requests per second, p99 latency in seconds) of one wrk run."""
    out = subprocess.run(
        ["wrk", "-t1", "-c16", f"-d{seconds:g}s", "--latency", url],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    m = re.search(r"99%\s+([\d.]+)(us|ms|s)", out)
    assert m, out
    return rps, float(m.group(1)) * _UNITS[m.group(2)]


def measure(seconds: float = 5.0, rounds: int = 3) -> list[Row]:
    """Interleaved wrk runs against the daemon and the bare reference."""
    subprocess.run([str(ROOT / "scripts" / "install-bench-tools.sh")], check=True)
    fakes = RackFakes()
    fakes.start()
    procs: list[subprocess.Popen[bytes]] = []
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RACKGUARD_FAKE_GPUS": "8"}
    try:
        with tempfile.TemporaryDirectory() as tmpdir:
            tmp = Path(tmpdir)
            port = _free_port()
            cfg = tmp / "rg.toml"
            cfg.write_text(_config(port, tmp, fakes))
            daemon = subprocess.Popen(
                [sys.executable, "-m", "fakes.nvml_module", "run", "--config", str(cfg)],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            procs.append(daemon)
            _wait_http(f"http://127.0.0.1:{port}/readyz", daemon)
            url = f"http://127.0.0.1:{port}/v1/state"
            with urllib.request.urlopen(url, timeout=5) as resp:
                body = resp.read()
            (tmp / "body.json").write_bytes(body)
            bare_port = _free_port()
            bare = subprocess.Popen(
                [sys.executable, "-m", "bench.api_bare", str(bare_port), str(tmp / "body.json")],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            procs.append(bare)
            bare_url = f"http://127.0.0.1:{bare_port}/v1/state"
            _wait_http(bare_url, bare)
            got: dict[str, list[tuple[float, float]]] = {"daemon": [], "bare": []}
            for _ in range(rounds):
                got["daemon"].append(_wrk(url, seconds))
                got["bare"].append(_wrk(bare_url, seconds))
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=10)
        fakes.stop()
    d_rps = median([r for r, _ in got["daemon"]])
    b_rps = median([r for r, _ in got["bare"]])
    d_p99 = median([p for _, p in got["daemon"]]) * 1e3
    b_p99 = median([p for _, p in got["bare"]]) * 1e3
    size = f"{len(body) / 1024:.1f} KB"
    return [
        Row(
            f"GET /v1/state req/s (8 GPUs, 2 PDUs, 1 CDU; {size})",
            d_rps,
            "req/s",
            "bare aiohttp, same bytes",
            b_rps,
            ">= 0.7x reference",
            d_rps >= 0.7 * b_rps,
        ),
        Row(
            "GET /v1/state p99 latency (wrk -t1 -c16)",
            d_p99,
            "ms",
            "bare aiohttp, same bytes",
            b_p99,
            "",
            None,
        ),
    ]
