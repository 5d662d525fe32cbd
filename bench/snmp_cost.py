"""Client CPU per OID of a 100-OID SNMP poll: the adapter against net-snmp's snmpget.

Both read the same 100 OIDs from the same snmpd (net-snmp, on loopback, values from
`override` lines) in the same run. The adapter polls in this process (CPU from
process_time over many polls); snmpget runs as one process per 100-OID GET (CPU of
the finished children, start-up included, as a collector that forks snmpget pays it).
Rounds interleave the three measurements; each value is the median over rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import subprocess
import tempfile
import time
from pathlib import Path

from adapters.sensors.snmp import SnmpAdapter, SnmpOptions
from adapters.sensors.snmp_client import V2cClient
from bench.report import Row, median
from fakes.snmpd import NetSnmpd

N_OIDS = 100
BASE = "1.3.6.1.4.1.99999.7"
TARGET_RATIO = 2.0


def _oids() -> list[str]:
    return [f"{BASE}.{i}.0" for i in range(1, N_OIDS + 1)]


def _profile(folder: Path) -> Path:
    """A profile of 100 scalar sensors, one per OID."""
    lines = ['id = "bench-100"', f'match = ["{BASE}"]']
    for i, oid in enumerate(_oids(), start=1):
        lines += ["[[sensor]]", f'id = "s{i}.current"', f'oid = "{oid}"', 'kind = "current"']
    path = folder / "bench-100.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _snmpget_cpu_per_oid_us(port: int, polls: int) -> float:
    cmd = ["snmpget", "-v2c", "-c", "public", "-On", "-Oq", f"127.0.0.1:{port}", *_oids()]
    before = _children_cpu_s()
    for _ in range(polls):
        done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, check=True)
        if done.stdout.count(b"\n") != N_OIDS:
            raise RuntimeError(f"snmpget returned {done.stdout[:200]!r}")
    return (_children_cpu_s() - before) / (polls * N_OIDS) * 1e6


async def _adapter_cpu_per_oid_us(adapter: SnmpAdapter, polls: int) -> float:
    before = time.process_time()
    for _ in range(polls):
        readings = await adapter.read()
        if len(readings) != N_OIDS or not all(r.usable for r in readings):
            raise RuntimeError("the adapter did not read all 100 OIDs")
    return (time.process_time() - before) / (polls * N_OIDS) * 1e6


async def _run(port: int, profile: Path, rounds: int, polls: int) -> list[Row]:
    def adapter(max_varbinds: int) -> SnmpAdapter:
        client = V2cClient("127.0.0.1", port, b"public", timeout_s=2.0, retries=1)
        options = SnmpOptions(max_varbinds=max_varbinds, profile=str(profile))
        return SnmpAdapter(f"bench-{max_varbinds}", client, options)

    one_get, default = adapter(N_OIDS), adapter(SnmpOptions().max_varbinds)
    samples: dict[str, list[float]] = {"one": [], "default": [], "snmpget": []}
    try:
        for a in (one_get, default):
            await a.connect()
            await a.read()  # warm-up
        for _ in range(rounds):
            samples["one"].append(await _adapter_cpu_per_oid_us(one_get, polls))
            samples["snmpget"].append(
                await asyncio.to_thread(_snmpget_cpu_per_oid_us, port, max(1, polls // 4))
            )
            samples["default"].append(await _adapter_cpu_per_oid_us(default, polls))
    finally:
        await one_get.close()
        await default.close()
    ref = median(samples["snmpget"])
    one = median(samples["one"])
    return [
        Row(
            name=f"SNMP poll CPU per OID, adapter ({N_OIDS} OIDs, one GET)",
            value=one,
            unit="us",
            reference_name=f"snmpget, {N_OIDS} OIDs, one process",
            reference=ref,
            target=f"<= {TARGET_RATIO:g}x",
            ok=one <= TARGET_RATIO * ref,
        ),
        Row(
            name=f"SNMP poll CPU per OID, adapter (default {SnmpOptions().max_varbinds} per GET)",
            value=median(samples["default"]),
            unit="us",
            reference_name=f"snmpget, {N_OIDS} OIDs, one process",
            reference=ref,
        ),
    ]


def measure(rounds: int = 7, polls: int = 40) -> list[Row]:
    """Median client CPU per OID over `rounds` interleaved rounds of `polls` polls each."""
    snmpd = NetSnmpd([f"override {oid} integer {i}" for i, oid in enumerate(_oids(), 1)])
    snmpd.start()
    try:
        with tempfile.TemporaryDirectory(prefix="rg-bench-snmp-") as folder:
            return asyncio.run(_run(snmpd.port, _profile(Path(folder)), rounds, polls))
    finally:
        snmpd.stop()


def main() -> None:
    """Print this benchmark's rows."""
    from bench.report import render  # noqa: PLC0415

    p = argparse.ArgumentParser(prog="python -m bench.snmp_cost")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--polls", type=int, default=40)
    args = p.parse_args()
    print(render(measure(args.rounds, args.polls)))


if __name__ == "__main__":
    main()
