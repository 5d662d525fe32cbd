"""Agent CPU and memory on the reference node: 8 GPUs polled at 1 Hz through the fake NVML.

The agent is the real `rackguard run` process (module-shaped fake NVML binding,
so the simulator's cost is not in it). The reference is the same daemon, same
config, polling once an hour instead — the cost of the process just being
there — run side by side over the same window.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.report import Row, median

ROOT = Path(__file__).resolve().parent.parent


def _config(port: int, interval: float, secret: Path, outbox: Path) -> str:
    # Each daemon its own outbox: the default path is one per machine, and a second
    # daemon on it is refused at start.
    return f"""
[node]
name = "bench-node"
[api]
port = {port}
[sources.gpus]
type = "nvml"
interval_s = {interval}
timeout_s = 0.5
[policy]
evaluate_interval_s = 1.0
# Readings must be fresh until the next poll (check-config refuses otherwise): the
# idle reference, polled hourly, keeps its readings as long.
stale_after_s = {max(5.0, 2 * interval)}
[scheduler]
type = "webhook"
url = "http://127.0.0.1:9/unused"
secret_file = "{secret}"
outbox_path = "{outbox}"
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _cpu_s(pid: int) -> float:
    """CPU seconds of every thread of the process (schedstat: nanoseconds, not 10 ms ticks).

    Threads that exited are not counted; the agent's threads live as long as it does.
    """
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total / 1e9


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


@dataclass
class Sampled:
    """Per-second CPU and RSS samples of one process."""

    cpu: list[float]
    rss: list[float]


def _start(cfg: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RACKGUARD_FAKE_GPUS": "8"}
    return subprocess.Popen(
        [sys.executable, "-m", "fakes.nvml_module", "run", "--config", str(cfg)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )


def _wait_listening(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("daemon exited during start-up")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("daemon did not start")


def measure(seconds: float = 60.0) -> list[Row]:
    """Run agent and reference side by side for `seconds`; CPU % of one core and RSS."""
    with tempfile.TemporaryDirectory() as tmp:
        secret = Path(tmp) / "key"
        secret.write_text("bench")
        secret.chmod(0o600)
        procs: dict[str, subprocess.Popen[bytes]] = {}
        try:
            for name, interval in (("agent", 1.0), ("idle", 3600.0)):
                port = _free_port()
                cfg = Path(tmp) / f"{name}.toml"
                cfg.write_text(_config(port, interval, secret, Path(tmp) / f"{name}.sqlite3"))
                procs[name] = _start(cfg)
                _wait_listening(port, procs[name])
            time.sleep(3.0)  # past start-up: imports, first connect
            samples = {n: Sampled([], []) for n in procs}
            start = time.monotonic()
            while time.monotonic() - start < seconds:
                for n, p in procs.items():
                    samples[n].cpu.append(_cpu_s(p.pid))
                    samples[n].rss.append(_rss_mb(p.pid))
                time.sleep(1.0)
            elapsed = time.monotonic() - start
        finally:
            for p in procs.values():
                p.terminate()
                p.wait(timeout=10)

    def pct(s: Sampled) -> float:
        return (s.cpu[-1] - s.cpu[0]) / elapsed * 100

    def window_pcts(s: Sampled) -> list[float]:
        step = 10
        return [
            (s.cpu[i + step] - s.cpu[i]) / step * 100 for i in range(0, len(s.cpu) - step, step)
        ]

    agent, idle = samples["agent"], samples["idle"]
    third = max(1, len(agent.rss) // 3)
    first_third = median(agent.rss[:third])
    last_third = median(agent.rss[-third:])
    agent_pct = pct(agent)
    return [
        Row(
            f"agent CPU, 8 GPUs @ 1 Hz, {elapsed:.0f}s (% of one core)",
            agent_pct,
            "%",
            "same daemon polling hourly",
            pct(idle),
            "<= 1 %",
            agent_pct <= 1.0,
        ),
        Row(
            "agent CPU, median of 10 s windows",
            median(window_pcts(agent)),
            "%",
            "same daemon polling hourly",
            median(window_pcts(idle)),
            "<= 1 %",
            median(window_pcts(agent)) <= 1.0,
        ),
        Row(
            "agent resident memory after the run",
            agent.rss[-1],
            "MB",
            "same daemon polling hourly",
            idle.rss[-1],
            "<= 100 MB",
            agent.rss[-1] <= 100,
        ),
        Row(
            "agent RSS growth, last third vs first third (medians)",
            last_third - first_third,
            "MB",
            "",
            None,
            "no growth (< 1 MB)",
            last_third - first_third < 1.0,
        ),
    ]
