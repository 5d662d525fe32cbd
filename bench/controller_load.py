"""The fleet's load on the controller: a 10,000-agent request pattern against a real slurmctld.

A real slurmctld 22.05 holds 10,002 nodes (scripts/start-slurm.sh with
SLURM_CI_EXTRA_NODES=10000: two with a slurmd, 10,000 that never run one). For
each mode the driver sends, for ``seconds``, the full node reads a fleet of
10,000 agents makes at the default settings, at their true rate, as the code
computes it (``SchedulerView.budget_interval`` without etcd; one reader every
``view_interval_s`` with etcd), plus the reconciler's one-node REST reads of the
held nodes (1 % held, every ``reconcile_interval_s``). Each full read is
``scontrol -o show nodes``: the same REQUEST_NODE_INFO RPC as ``GET /nodes``.

Measured per mode, in the same run, four phases of ``seconds``: slurmctld's CPU
(/proc/PID/stat) idle and under that load, and its REQUEST_NODE_INFO count
(``sdiag``, reset first) -- the fleet's cost is the loaded CPU less the idle --;
then the latency of a drain (``scontrol update``) and of a (held) ``sbatch``,
sampled identically idle and under the load.

With etcd, also: 1,000 agents' leases (kept alive every third of the TTL) and
watches of the prefix, each its own client as in a fleet, with the cluster's
reader writing ``view/at`` every interval, against a real etcd: the etcd
server's CPU at steady state.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from contextlib import suppress
from pathlib import Path

import aiohttp

from bench.delivery_latency import start_slurm, stop_slurm
from bench.fleet_cost import _cpu_s
from bench.report import Row, median
from daemon.cluster.etcd import EtcdClient, EtcdError
from daemon.cluster.scheduler_view import SchedulerView
from daemon.config.cluster import ClusterConfig
from daemon.config.scheduler import DeliverySettings
from fakes.etcd_server import EtcdServer, etcd_available

AGENTS = 10_000
HELD = AGENTS // 100  # nodes held by rackguard: their reconciler reads them
CPU_TARGET = 0.05  # of one controller core
LATENCY_TARGET = 1.2  # x idle
ETCD_AGENTS = 1_000
ETCD_TARGET = 0.10


def fleet_rates(cluster: ClusterConfig, reconcile_s: float) -> dict[str, tuple[float, float]]:
    """Mode -> (full reads/s, one-node reads/s) of a 10,000-agent fleet at these settings."""

    class _Never:
        async def list_nodes(self) -> list[object]:
            raise AssertionError("not read")

    view = SchedulerView(
        _Never(),  # type: ignore[arg-type]
        interval_s=cluster.view_interval_s,
        horizon_s=600.0,
        budget_reads_per_s=cluster.view_budget_reads_per_s,
    )
    one_node = HELD / reconcile_s
    return {
        "scheduler view (no etcd)": (AGENTS / view.budget_interval(AGENTS), one_node),
        "etcd (one reader)": (1.0 / cluster.view_interval_s, one_node),
    }


def _sdiag_node_info(env: dict[str, str]) -> int:
    out = subprocess.run(["sdiag"], env=env, capture_output=True, text=True, check=True).stdout
    m = re.search(r"REQUEST_NODE_INFO\s+\(\s*\d+\)\s+count:(\d+)", out)
    return int(m.group(1)) if m else 0


async def _run(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        *argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    await proc.wait()
    return (time.perf_counter() - t0) * 1000


async def _at_rate(
    rate: float, seconds: float, job: Callable[[], Coroutine[object, None, object]]
) -> int:
    """``job`` at uniformly random times, ``rate`` per second on average, for ``seconds``."""
    n = round(rate * seconds)
    times = sorted(random.uniform(0, seconds) for _ in range(n))
    t0 = time.perf_counter()
    tasks: list[asyncio.Task[object]] = []
    for t in times:
        await asyncio.sleep(max(0.0, t0 + t - time.perf_counter()))
        tasks.append(asyncio.create_task(job()))
    await asyncio.gather(*tasks, return_exceptions=True)
    return n


class Phase:
    """One phase: slurmctld CPU and NODE_INFO RPCs over it, drain and sbatch latencies in it."""

    def __init__(self, env: dict[str, str], pid: int, seconds: float) -> None:
        self.env = env
        self.pid = pid
        self.seconds = seconds
        self.cpu_s = 0.0
        self.node_info = 0
        self.drain_ms: list[float] = []
        self.sbatch_ms: list[float] = []

    async def run(
        self, load: Callable[[], Coroutine[object, None, object]] | None, *, sample: bool
    ) -> None:
        """``seconds`` while ``load`` runs (None: idle), sampling latencies or not."""
        await _run(["sdiag", "--reset"], self.env)
        cpu0, t0 = _cpu_s(self.pid), time.perf_counter()
        loader = asyncio.create_task(load()) if load is not None else None
        flip = False
        while time.perf_counter() - t0 < self.seconds:
            if not sample:
                await asyncio.sleep(self.seconds - (time.perf_counter() - t0))
                continue
            flip = not flip
            state = ["state=drain", "reason=bench"] if flip else ["state=resume"]
            argv = ["scontrol", "update", "nodename=gpu02", *state]
            self.drain_ms.append(await _run(argv, self.env))
            # Held: a job that ran would add its own scheduling and completion work.
            sbatch = ["sbatch", "--hold", "-p", "gpu", "-o", "/dev/null", "--wrap", "true"]
            self.sbatch_ms.append(await _run(sbatch, self.env))
            await asyncio.sleep(0.4)
        if loader is not None:
            await loader
        self.cpu_s = _cpu_s(self.pid) - cpu0
        self.node_info = _sdiag_node_info(self.env)
        if flip:
            await _run(["scontrol", "update", "nodename=gpu02", "state=resume"], self.env)
        await _run(["scancel", "--user=root"], self.env)


async def _mode(
    values: dict[str, str], pid: int, name: str, rates: tuple[float, float], seconds: float
) -> list[Row]:
    env = dict(os.environ, SLURM_CONF=values["SLURM_CONF"])
    full_rate, one_rate = rates
    token = await asyncio.to_thread(Path(values["SLURM_JWT_FILE"]).read_text)
    headers = {"X-SLURM-USER-NAME": values["SLURM_REST_USER"], "X-SLURM-USER-TOKEN": token.strip()}
    base = f"{values['SLURM_REST_URL']}/slurm/{values['SLURM_REST_API']}/node/"
    async with aiohttp.ClientSession(headers=headers) as http:

        async def one_node() -> None:
            async with http.get(base + f"x{random.randint(1, HELD):05d}") as resp:
                await resp.read()

        async def load() -> None:
            full = ["scontrol", "-o", "show", "nodes"]
            await asyncio.gather(
                _at_rate(full_rate, seconds, lambda: _run(full, env)),
                _at_rate(one_rate, seconds, one_node),
            )

        # CPU without the latency probes (their own RPCs would blur it), then the probes.
        quiet, busy, idle, loaded = (Phase(env, pid, seconds) for _ in range(4))
        for phase, with_load, sample in (
            (quiet, False, False),
            (busy, True, False),
            (idle, False, True),
            (loaded, True, True),
        ):
            await asyncio.to_thread(_quiet, pid)
            await phase.run(load if with_load else None, sample=sample)
    cost = max(0.0, busy.cpu_s - quiet.cpu_s) / seconds
    drain, drain0 = median(loaded.drain_ms), median(idle.drain_ms)
    sbatch, sbatch0 = median(loaded.sbatch_ms), median(idle.sbatch_ms)
    per_s = busy.node_info / seconds
    return [
        Row(
            f"{name}: slurmctld CPU for 10,000 agents ({full_rate:.2g} full reads/s,"
            f" {per_s:.2g} NODE_INFO RPC/s by sdiag)",
            cost * 100,
            "% of a core",
            "idle phase",
            quiet.cpu_s / seconds * 100,
            f"<= {CPU_TARGET:.0%}",
            cost <= CPU_TARGET,
        ),
        Row(
            f"{name}: drain (scontrol update) median under load",
            drain,
            "ms",
            "idle",
            drain0,
            f"<= {LATENCY_TARGET}x idle",
            drain <= LATENCY_TARGET * drain0,
        ),
        Row(
            f"{name}: sbatch median under load",
            sbatch,
            "ms",
            "idle",
            sbatch0,
            f"<= {LATENCY_TARGET}x idle",
            sbatch <= LATENCY_TARGET * sbatch0,
        ),
    ]


def _quiet(pid: int, limit: float = 0.02, timeout_s: float = 120.0) -> None:
    """Wait for slurmctld's start-up work (it asks every node to register) to end."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        c0 = _cpu_s(pid)
        time.sleep(2.0)
        if (_cpu_s(pid) - c0) / 2.0 < limit:
            return


async def _etcd_steady(
    url: str, server_pid: int, agents: int, seconds: float, view_interval_s: float
) -> float:
    """etcd's CPU share with ``agents`` leases kept alive and watching, and one view reader."""
    ttl = ClusterConfig().lease_ttl_s
    prefix = "/bench-steady/"
    clients = [EtcdClient([url], timeout_s=30.0) for _ in range(agents)]

    async def agent(c: EtcdClient) -> None:
        lease = await c.grant(ttl)
        await asyncio.sleep(random.uniform(0, ttl / 3))
        while True:
            await c.keepalive(lease)
            await asyncio.sleep(ttl / 3)

    async def watch(c: EtcdClient) -> None:
        with suppress(EtcdError):
            async for _ in c.watch(prefix, 1):
                pass

    async def reader(c: EtcdClient) -> None:
        lease = await c.grant(ttl)
        while True:
            await c.put(prefix + "view/at", f'{{"by":"n0","at":{time.time()}}}', lease)
            await asyncio.sleep(view_interval_s)

    tasks = [asyncio.create_task(agent(c)) for c in clients]
    tasks += [asyncio.create_task(watch(c)) for c in clients]
    tasks.append(asyncio.create_task(reader(clients[0])))
    try:
        await asyncio.sleep(ttl)  # every lease granted, every watch open
        cpu0 = _cpu_s(server_pid)
        await asyncio.sleep(seconds)
        return (_cpu_s(server_pid) - cpu0) / seconds
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(c.close() for c in clients))


def measure(seconds: float = 20.0) -> list[Row]:
    """One row set per mode against a 10,002-node slurmctld; the etcd steady-state row."""
    rows: list[Row] = []
    cluster = ClusterConfig()
    rates = fleet_rates(cluster, DeliverySettings().reconcile_interval_s)
    work = Path(tempfile.mkdtemp(prefix="rg-bench-ctld-", dir="/tmp"))
    try:
        values = start_slurm(work, who="controller_load", nodes=2, extra_nodes=AGENTS)
        if values is None:
            rows.append(Row("controller rows skipped: no real Slurm (see stderr)", 0.0, ""))
        else:
            pid = int((work / "pids" / "slurmctld.pid").read_text())
            for name, r in rates.items():
                rows += asyncio.run(_mode(values, pid, name, r, seconds))
    finally:
        stop_slurm(work)
    why = etcd_available()
    if why:
        print(f"controller_load: etcd row skipped: {why}", file=sys.stderr)
        rows.append(Row(f"etcd row skipped: {why}", 0.0, ""))
        return rows
    server = EtcdServer()
    server.start()
    try:
        etcd_pid = server.pid()
        assert etcd_pid is not None, "etcd exited"
        share = asyncio.run(
            _etcd_steady(server.url, etcd_pid, ETCD_AGENTS, seconds, cluster.view_interval_s)
        )
    finally:
        server.close()
    rows.append(
        Row(
            f"etcd: {ETCD_AGENTS:,} agents' leases + watches, one view reader, steady state",
            share * 100,
            "% of a core",
            target=f"<= {ETCD_TARGET:.0%}",
            ok=share <= ETCD_TARGET,
        )
    )
    return rows


if __name__ == "__main__":
    from bench.report import render

    print(render(measure()))
