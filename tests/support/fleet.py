"""A fleet of real `rackguard run` processes, one per simulated node, on one fake slurmrestd.

Each agent reads its GPUs through the real NVML adapter bound to
``fakes.nvml_fed``, which the simulator (in the test process) feeds through a
file per node; every agent delivers to one FakeSlurmrestd holding every node,
which records each state change with its wall time. Time settings are scaled
by ``speed`` as in the demo, so the policy sees simulated time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp

from fakes.processes import stop_process
from fakes.sim import SimulatedRack
from fakes.sim.nvml_bridge import write_feed
from fakes.slurmrestd import FakeSlurmrestd, Write
from tests.support.paths import ROOT
from tests.support.secrets import write_secret
from tests.support.wait import wait_until

API_TOKEN = "fleet-api-token"


def free_port() -> int:
    """A free loopback TCP port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Agent:
    """One agent process."""

    node: str
    rack: str
    port: int
    config: Path
    feed: Path
    proc: subprocess.Popen[bytes] | None = None


@dataclass
class FleetRun:
    """The racks of simulated nodes, their agents and the scheduler they share."""

    tmp: Path
    racks: dict[str, SimulatedRack]  # rack name -> its simulator
    speed: float
    policy: dict[str, float] = field(default_factory=dict)  # overrides of [policy] keys
    etcd: list[str] = field(default_factory=list)
    view_interval_s: float = 0.5
    sources: dict[str, str] = field(default_factory=dict)  # node -> more [sources.X] tables
    agents: dict[str, Agent] = field(default_factory=dict)
    slurm: FakeSlurmrestd | None = None
    overrides: dict[str, float] = field(default_factory=dict)  # node -> forced GPU0 temp
    _player: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Start the scheduler and every agent; return once every agent is ready."""
        rack_of = {n: r for r, sim in self.racks.items() for n in sim.scenario.rack.nodes}
        self.slurm = FakeSlurmrestd(list(rack_of), racks=rack_of)
        await self.slurm.start()
        write_secret(self.tmp / "slurm.jwt", "token-root\n")
        write_secret(self.tmp / "api.token", API_TOKEN + "\n")
        for node, rack in rack_of.items():
            a = Agent(node, rack, free_port(), self.tmp / f"{node}.toml", self.tmp / f"{node}.json")
            a.config.write_text(self._config(a))
            self.agents[node] = a
        self.feed()
        for a in self.agents.values():
            self.launch(a)
        for a in self.agents.values():
            await wait_until(partial(self._ready, a), timeout=60, what=f"{a.node} ready")
        self._player = asyncio.create_task(self._play(), name="simulator")

    def launch(self, a: Agent) -> None:
        """Start (or restart) one agent process."""
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "RACKGUARD_FAKE_GPU_FEED": str(a.feed),
        }
        log = (self.tmp / f"{a.node}.log").open("ab")
        a.proc = subprocess.Popen(
            # rackguard on a node whose NVML the simulator feeds
            [sys.executable, "-m", "fakes.nvml_fed", "run", "--config", str(a.config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=ROOT,
        )
        log.close()

    def _ready(self, a: Agent) -> bool:
        assert a.proc is not None
        if a.proc.poll() is not None:
            raise AssertionError(f"{a.node} exited: {self.log(a.node)[-3000:]}")
        try:
            with socket.create_connection(("127.0.0.1", a.port), timeout=0.2):
                return True
        except OSError:
            return False

    def log(self, node: str) -> str:
        """An agent's output so far."""
        return (self.tmp / f"{node}.log").read_text(errors="replace")

    def feed(self) -> None:
        """Write every node's GPU state from its rack's simulator (and any forced value)."""
        for sim in self.racks.values():
            for snap in sim.snapshot.nodes:
                write_feed(snap, self.agents[snap.name].feed, self.overrides.get(snap.name))

    @property
    def t(self) -> float:
        """Simulated seconds."""
        return next(iter(self.racks.values())).t

    async def _play(self) -> None:
        """Play the simulators in step with the wall clock (``speed``), feeding the agents."""
        loop = asyncio.get_running_loop()
        start, t0 = loop.time(), self.t
        while True:
            target = t0 + (loop.time() - start) * self.speed
            for sim in self.racks.values():
                if target > sim.t:
                    sim.advance(target - sim.t)
            self.feed()
            await asyncio.sleep(0.1)

    async def advance_to(self, t: float) -> None:
        """Wait until the simulators reach simulated ``t``."""
        await wait_until(lambda: self.t >= t, timeout=(t - self.t) / self.speed + 30, what=f"t={t}")

    async def fast_forward(self, t: float) -> None:
        """Jump the simulators to ``t`` (before the agents watch)."""
        for sim in self.racks.values():
            while sim.t < t:
                sim.advance(min(5.0, t - sim.t))

    async def api(self, node: str, method: str, path: str, body: Any = None) -> Any:
        """Call an agent's HTTP API."""
        a = self.agents[node]
        headers = {"Authorization": f"Bearer {API_TOKEN}"}
        async with (
            aiohttp.ClientSession() as s,
            s.request(
                method, f"http://127.0.0.1:{a.port}{path}", json=body, headers=headers
            ) as resp,
        ):
            return await resp.json()

    async def metrics(self, node: str) -> str:
        """An agent's /metrics, as Prometheus scrapes it."""
        a = self.agents[node]
        headers = {"Authorization": f"Bearer {API_TOKEN}"}
        async with (
            aiohttp.ClientSession() as s,
            s.get(f"http://127.0.0.1:{a.port}/metrics", headers=headers) as resp,
        ):
            return await resp.text()

    def kill(self, node: str) -> None:
        """SIGKILL one agent (a dead agent: no goodbye to etcd)."""
        proc = self.agents[node].proc
        assert proc is not None
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def stop(self) -> None:
        """SIGTERM every agent still running."""
        procs = [a.proc for a in self.agents.values() if a.proc is not None]
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            stop_process(p, grace_s=10.0)

    async def close(self) -> None:
        """Stop the simulator, the agents and the scheduler."""
        if self._player is not None:
            self._player.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._player
        self.stop()
        if self.slurm is not None:
            await self.slurm.stop()

    @property
    def writes(self) -> list[Write]:
        """Every state change the scheduler recorded, in order."""
        assert self.slurm is not None
        return list(self.slurm.writes)

    def _config(self, a: Agent) -> str:
        assert self.slurm is not None
        sp = self.speed
        interval = 3.0 / sp
        policy = {
            "min_dwell_s": 60.0 / sp,
            "resume_after_s": 120.0 / sp,
            "stale_after_s": 15.0 / sp,
            "evaluate_interval_s": interval,
            "rack_stale_after_s": 30.0 / sp,
            "lead_time_s": 600.0 / sp,
            "trend_window_s": 300.0 / sp,
            "trend_bucket_s": 10.0 / sp,
            "skill_horizon_s": 60.0 / sp,
            "load_settle_s": 120.0 / sp,
            "max_gpu_rate_c_per_min": 10.0 * sp,
            "max_air_rate_c_per_min": 5.0 * sp,
            "flow_loss_confirm_s": 5.0 / sp,
            "critical_grace_s": 20.0 / sp,
            "storm_window_s": 600.0 / sp,
            "resume_window_s": 60.0 / sp,
            "resume_jitter": 0.05,
            **self.policy,
        }
        policy_lines = "\n".join(f"{k} = {_toml(v)}" for k, v in policy.items())
        etcd = ", ".join(f'"{u}"' for u in self.etcd)
        return f"""
[node]
name = "{a.node}"
rack = "{a.rack}"
[api]
port = {a.port}
token_file = "{self.tmp / "api.token"}"
[sources.gpus]
type = "nvml"
interval_s = {interval}
timeout_s = {interval * 0.8}
backoff_initial_s = {interval}
backoff_max_s = {interval * 4}
{self.sources.get(a.node, "")}
[policy]
{policy_lines}
[scheduler]
type = "slurm"
rest_url = "{self.slurm.url}"
token_file = "{self.tmp / "slurm.jwt"}"
retry_initial_s = 0.1
retry_max_s = 0.5
reconcile_interval_s = 0
outbox_path = "{self.tmp / f"outbox-{a.node}.sqlite3"}"
# The fleet reads exclusions as DOWN; the fake slurmrestd runs no jobs to tell.
exclude_state = "down"
notice_signal = ""
requeue = false
[cluster]
view_interval_s = {self.view_interval_s}
view_budget_reads_per_s = 1000
etcd = [{etcd}]
lease_ttl_s = 3
claim_timeout_s = 0.5
"""


def _toml(v: float) -> str:
    return repr(v) if isinstance(v, float) else str(v)


def max_predictive_out(writes: Iterable[Write]) -> int:
    """The most nodes drained but not down (predictive drains) at any one time."""
    state: dict[str, str] = {}
    most = 0
    for w in writes:
        state[w.node] = w.after
        most = max(most, sum(1 for s in state.values() if s == "IDLE+DRAIN"))
    return most
