"""The fleet's load on the controller: a 10,000-agent request pattern against a real slurmctld.

A real slurmctld 22.05 holds 10,002 nodes (scripts/start-slurm.sh with
SLURM_CI_EXTRA_NODES=10000: two with a slurmd, 10,000 that never run one). For
each mode the driver sends, for ``seconds``, the full node reads a fleet of
10,000 agents makes at the default settings, at their true rate, as the code
computes it (``SchedulerView.budget_interval`` without etcd; one reader every
``view_interval_s`` with etcd), plus the reconciler's one-node REST reads of the
held nodes (1 % held, every ``reconcile_interval_s``). Each full read is
``scontrol -o show nodes``: the same REQUEST_NODE_INFO RPC as ``GET /nodes``.

Measured per mode, in the same run, with the load on in every other 2-s slice:
slurmctld's CPU (/proc/PID/stat) in the loaded slices less the idle ones (its
REQUEST_NODE_INFO count from ``sdiag``, reset first, as a check); then the
latency of a drain (``scontrol update``) and of a (held) ``sbatch``, sampled the
same way in idle and loaded slices.

With etcd, also: 1,000 of the daemon's own EtcdAgents (each its own client, as
in a fleet; spread over a few processes) in racks of 40, standing for their
rack's lead and for the view as the daemon does, the leaders publishing a rack
source, the view's reader writing ``view/at`` every interval; against a real
etcd: the etcd server's CPU at steady state, median of three fresh runs.
``python -m bench.controller_load etcd`` prints that row alone.
"""

from __future__ import annotations

import asyncio
import multiprocessing
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
from daemon.cluster.agent import EtcdAgent
from daemon.cluster.etcd import EtcdClient, EtcdError
from daemon.cluster.scheduler_view import SchedulerView
from daemon.config.cluster import ClusterConfig
from daemon.config.scheduler import DeliverySettings
from daemon.config.snmp import SnmpSourceConfig
from fakes.etcd_server import EtcdServer, etcd_available

AGENTS = 10_000
HELD = AGENTS // 100  # nodes held by rackguard: their reconciler reads them
CPU_TARGET = 0.05  # of one controller core
LATENCY_TARGET = 1.2  # x idle
ETCD_AGENTS = 1_000
ETCD_TARGET = 0.10
ETCD_PREFIX = "/bench-steady/"

Load = Callable[[float, Callable[[float], bool]], Coroutine[object, None, None]]


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


SLICE_S = 2.0  # the latency probes alternate idle and loaded slices of this length


def _loaded(t: float) -> bool:
    return int(t / SLICE_S) % 2 == 1


async def _at_rate(
    rate: float,
    seconds: float,
    job: Callable[[], Coroutine[object, None, object]],
    when: Callable[[float], bool] = lambda t: True,
) -> int:
    """``job`` at uniformly random times, ``rate`` per second, for ``seconds`` where ``when``."""
    times = sorted(random.uniform(0, seconds) for _ in range(round(rate * seconds)))
    times = [t for t in times if when(t)]
    t0 = time.perf_counter()
    tasks: list[asyncio.Task[object]] = []
    for t in times:
        await asyncio.sleep(max(0.0, t0 + t - time.perf_counter()))
        tasks.append(asyncio.create_task(job()))
    await asyncio.gather(*tasks, return_exceptions=True)
    return len(times)


async def _cpu(
    env: dict[str, str], pid: int, seconds: float, load: Load
) -> tuple[float, float, int]:
    """slurmctld's CPU-seconds in idle and in loaded slices (``seconds`` of each), and the
    NODE_INFO RPCs it served meanwhile. Slices alternate every ``SLICE_S``, so background
    work (slurmctld pinging its 10,000 silent nodes after a node's state change, ~0.3
    core for ~25 s; the machine's other load) falls on both alike."""
    await asyncio.to_thread(_quiet, pid)
    await _run(["sdiag", "--reset"], env)
    loader = asyncio.create_task(load(2 * seconds, _loaded))
    t0 = time.perf_counter()
    spent = {False: 0.0, True: 0.0}
    last = _cpu_s(pid)
    for k in range(round(2 * seconds / SLICE_S)):
        await asyncio.sleep(max(0.0, t0 + (k + 1) * SLICE_S - time.perf_counter()))
        now = _cpu_s(pid)
        spent[k % 2 == 1] += now - last
        last = now
    await loader
    return spent[False], spent[True], await asyncio.to_thread(_sdiag_node_info, env)


async def _probe(
    env: dict[str, str], pid: int, seconds: float, load: Load
) -> dict[bool, tuple[list[float], list[float]]]:
    """Drain and sbatch latencies, loaded -> (drain ms, sbatch ms), in alternating slices.

    Idle and loaded samples interleave every ``SLICE_S``, so a drift in the
    machine's other load falls on both alike.
    """
    await asyncio.to_thread(_quiet, pid)
    out: dict[bool, tuple[list[float], list[float]]] = {False: ([], []), True: ([], [])}
    loader = asyncio.create_task(load(2 * seconds, _loaded))
    t0 = time.perf_counter()
    flip = False
    while (t := time.perf_counter() - t0) < 2 * seconds:
        flip = not flip
        drains, sbatches = out[_loaded(t)]
        # Undrain, not resume: a resume has slurmctld ping every node (25 s here).
        state = ["state=drain", "reason=bench"] if flip else ["state=undrain"]
        drains.append(await _run(["scontrol", "update", "nodename=gpu02", *state], env))
        # Held: a job that ran would add its own scheduling and completion work.
        sbatch = ["sbatch", "--hold", "-p", "gpu", "-o", "/dev/null", "--wrap", "true"]
        sbatches.append(await _run(sbatch, env))
        await asyncio.sleep(0.2)
    await loader
    await _run(["scontrol", "update", "nodename=gpu02", "state=undrain"], env)
    await _run(["scancel", "--user=root"], env)
    return out


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

        async def load(length: float, when: Callable[[float], bool]) -> None:
            full = ["scontrol", "-o", "show", "nodes"]
            await asyncio.gather(
                _at_rate(full_rate, length, lambda: _run(full, env), when),
                _at_rate(one_rate, length, one_node, when),
            )

        quiet_cpu, busy_cpu, node_info = await _cpu(env, pid, seconds, load)
        lat = await _probe(env, pid, seconds, load)
    cost = max(0.0, busy_cpu - quiet_cpu) / seconds
    drain, drain0 = median(lat[True][0]), median(lat[False][0])
    sbatch, sbatch0 = median(lat[True][1]), median(lat[False][1])
    per_s = node_info / seconds  # all in the loaded slices
    return [
        Row(
            f"{name}: slurmctld CPU for 10,000 agents ({full_rate:.2g} full reads/s,"
            f" {per_s:.2g} NODE_INFO RPC/s by sdiag)",
            cost * 100,
            "% of a core",
            "idle slices",
            quiet_cpu / seconds * 100,
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


def _registered(log: Path, timeout_s: float = 180.0) -> None:
    """Wait for slurmctld's start-up round (it asks every node to register, ~0.3 core for
    ~25 s with 10,000 silent nodes, starting some seconds after it answers)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if "agent msg_type=1001 ran for" in log.read_text(errors="replace"):
            return
        time.sleep(1.0)
    print("controller_load: slurmctld's registration round not seen; going on", file=sys.stderr)


def _quiet(pid: int, limit: float = 0.02, timeout_s: float = 60.0) -> None:
    """Wait until slurmctld is idle (under ``limit`` of a core over 2 s)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        c0 = _cpu_s(pid)
        time.sleep(2.0)
        if (_cpu_s(pid) - c0) / 2.0 < limit:
            return


RACK_SIZE = 40  # agents per rack, as in the 10,000-node slurmctld
WORKERS = 4  # client processes the 1,000 agents are spread over (etcd is measured, not them)
EVIDENCE_BYTES = 1024  # one rack source's publication (a PDU's few readings)
EVIDENCE_S = SnmpSourceConfig("snmp", "pdu").interval_s  # one PDU a rack, at its default


async def _agents(
    url: str,
    nodes: list[str],
    fleet: int,
    seconds: float,
    evidence_s: float,
    out: multiprocessing.Queue[tuple[int, int]],
) -> None:
    """The daemon's EtcdAgents for ``nodes``: elections, claims' leases, publications, watches.

    Each agent stands for its rack's lead every third of the TTL and for the view
    every ``view_interval_s`` (as RackLeader and SchedulerView do: a request only
    when the key is absent; the view's election spread over ``fleet``, the size
    an agent knows from the last view); a rack leader publishes one rack source every
    ``evidence_s``, the view's reader ``view/at`` every interval. Puts (lease
    holders, leases granted) on ``out`` at the end.
    """
    c = ClusterConfig()
    agents = [
        EtcdAgent(
            EtcdClient([url], timeout_s=5.0), n, prefix=ETCD_PREFIX, lease_ttl_s=c.lease_ttl_s
        )
        for n in nodes
    ]
    rack = {a.node: f"r{int(a.node[1:]) // RACK_SIZE:03d}" for a in agents}
    blob = b"x" * EVIDENCE_BYTES

    async def leads(a: EtcdAgent) -> None:
        await asyncio.sleep(random.uniform(0, c.lease_ttl_s / 3))
        published = 0.0
        while True:
            if await a.stand("leader", rack[a.node]) and time.monotonic() - published >= evidence_s:
                published = time.monotonic()
                with suppress(EtcdError):
                    key = a.claims.key("evidence", rack[a.node], "pdu")
                    await a.etcd.put(key, blob, a.claims.lease)
            await asyncio.sleep(c.lease_ttl_s / 3)

    async def views(a: EtcdAgent) -> None:
        await asyncio.sleep(random.uniform(0, c.view_interval_s))
        while True:
            if await a.stand("viewer", candidates=fleet):
                with suppress(EtcdError):
                    at = f'{{"by":"{a.node}","at":{time.time()}}}'
                    await a.etcd.put(a.claims.key("view", "at"), at, a.claims.lease)
            await asyncio.sleep(c.view_interval_s)

    async def joins(a: EtcdAgent) -> None:
        await asyncio.sleep(random.uniform(0, c.lease_ttl_s))  # booted over a TTL, not at once
        await a.run()

    tasks = [asyncio.create_task(joins(a)) for a in agents]
    tasks += [asyncio.create_task(leads(a)) for a in agents]
    tasks += [asyncio.create_task(views(a)) for a in agents]
    try:
        await asyncio.sleep(seconds)
        # Told before the teardown, which may take a while on a loaded machine.
        out.put((sum(a.claims.lease != 0 for a in agents), sum(a.grants for a in agents)))
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(a.etcd.close() for a in agents))


def _worker(
    url: str,
    nodes: list[str],
    fleet: int,
    seconds: float,
    evidence_s: float,
    out: multiprocessing.Queue[tuple[int, int]],
) -> None:
    asyncio.run(_agents(url, nodes, fleet, seconds, evidence_s, out))


def etcd_steady(
    url: str, server_pid: int, agents: int, seconds: float, evidence_s: float = EVIDENCE_S
) -> tuple[float, int]:
    """etcd's CPU share (of one core) with ``agents`` of the daemon's agents at steady state.

    Warm-up: three TTLs (every watch open, the start's election losers' leases
    given back). Also the lease holders at the end.
    """
    warm = 3.0 * ClusterConfig().lease_ttl_s
    nodes = [f"n{i:05d}" for i in range(agents)]
    out: multiprocessing.Queue[tuple[int, int]] = multiprocessing.Queue()
    procs = [
        multiprocessing.Process(
            target=_worker, args=(url, nodes[i::WORKERS], agents, warm + seconds, evidence_s, out)
        )
        for i in range(WORKERS)
    ]
    for proc in procs:
        proc.start()
    try:
        time.sleep(warm)
        cpu0 = _cpu_s(server_pid)
        time.sleep(seconds)
        share = (_cpu_s(server_pid) - cpu0) / seconds
        holders = sum(out.get(timeout=60)[0] for _ in procs)
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    return share, holders


def etcd_rows(seconds: float = 20.0, runs: int = 3, agents: int = ETCD_AGENTS) -> list[Row]:
    """The etcd steady-state row: the median of ``runs``, each on a fresh etcd."""
    why = etcd_available()
    if why:
        print(f"controller_load: etcd row skipped: {why}", file=sys.stderr)
        return [Row(f"etcd row skipped: {why}", 0.0, "")]
    shares, holders = [], []
    for _ in range(runs):
        server = EtcdServer()
        server.start()
        try:
            etcd_pid = server.pid()
            assert etcd_pid is not None, "etcd exited"
            share, held = etcd_steady(server.url, etcd_pid, agents, seconds)
        finally:
            server.close()
        shares.append(share)
        holders.append(float(held))
        print(
            f"controller_load: etcd run: {share:.2%} of a core, {held} holding a lease",
            file=sys.stderr,
        )
    share = median(shares)
    return [
        Row(
            f"etcd: {agents:,} agents' leases + watches, steady state"
            f" ({median(holders):.0f} holding a lease; median of {runs})",
            share * 100,
            "% of a core",
            target=f"<= {ETCD_TARGET:.0%}",
            ok=share <= ETCD_TARGET if agents == ETCD_AGENTS else None,
        )
    ]


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
            _registered(work / "log" / "slurmctld.log")
            for name, r in rates.items():
                rows += asyncio.run(_mode(values, pid, name, r, seconds))
    finally:
        stop_slurm(work)
    return rows + etcd_rows(seconds)


if __name__ == "__main__":
    from bench.report import render

    # python -m bench.controller_load etcd [AGENTS]: the etcd row alone (no Slurm needed)
    if sys.argv[1:2] == ["etcd"]:
        print(render(etcd_rows(agents=int(sys.argv[2]) if sys.argv[2:] else ETCD_AGENTS)))
    else:
        print(render(measure()))
