"""Client CPU per delivered CDU value over OPC-UA: subscription and batched Read vs one Read each.

The fake CDU server runs in its own process (``python -m bench.opcua_cost --serve PORT``)
and changes all eight values every ``period`` seconds, so only the client's CPU is in
this process's ``time.process_time()``. Three ways of getting the values are measured
in interleaved rounds, medians reported:

* subscription: the real OpcuaAdapter in subscription mode (100 ms sampling), CPU per
  data-change notification received, read() included once per second;
* batched Read: the real OpcuaAdapter in poll mode, one Read for all values per call;
* reference: one asyncua Read call per variable, the way many collectors poll.

A CDU has few variables (8 here), so per-request and per-publish fixed costs weigh
more than in a 50-variable measurement: expect smaller ratios than with big batches.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import subprocess
import sys
import time
from pathlib import Path

from asyncua import ua
from asyncua.ua.attribute_ids import AttributeIds

from adapters.sensors.opcua import OpcuaAdapter, OpcuaSettings
from adapters.sensors.opcua_profiles import load_profile
from adapters.sensors.opcua_session import SessionSettings, close_session, open_session
from bench.report import Row, median, render
from fakes.cdu_server import FakeCduServer, free_port
from fakes.sim.thermal import CduSnapshot

ROOT = Path(__file__).resolve().parent.parent
VALUES = 8  # the generic CDU model's variables
PERIOD_S = 0.1


async def _serve(port: int, period_s: float) -> None:
    """The server process: the generic fake CDU, every value changing every period."""
    server = FakeCduServer(model="generic", port=port)
    await server.start()
    print("ready", flush=True)
    k = 0
    try:
        while True:
            k += 1
            on = k % 2 == 0
            await server.publish(
                CduSnapshot(
                    30 + k % 7, 37 + k % 5, 40 + k % 3, 120 + k % 11, 60 + k % 9, on, on, on
                )
            )
            await asyncio.sleep(period_s)
    finally:
        await server.stop()


def _settings(url: str, mode: str) -> OpcuaSettings:
    return OpcuaSettings(
        SessionSettings(url),
        load_profile("generic"),
        mode="poll" if mode == "poll" else "subscription",
        sampling_interval_s=PERIOD_S,
        keepalive_s=1.0,
        stale_after_s=5.0,
        bad_after_s=10.0,
    )


async def _subscription(url: str, seconds: float) -> float:
    """CPU seconds per notification received by the subscribing adapter."""
    adapter = OpcuaAdapter("bench", _settings(url, "subscription"))
    await adapter.connect()
    try:
        await asyncio.sleep(0.5)  # let the initial burst pass
        n0, cpu0 = adapter.notifications, time.process_time()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            await adapter.read()
            await asyncio.sleep(1.0)
        cpu, n = time.process_time() - cpu0, adapter.notifications - n0
    finally:
        await adapter.close()
    return cpu / max(n, 1)


async def _batched(url: str, seconds: float) -> float:
    """CPU seconds per value for the polling adapter's one-Read-for-all reads."""
    adapter = OpcuaAdapter("bench", _settings(url, "poll"))
    await adapter.connect()
    try:
        values, cpu0 = 0, time.process_time()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            values += len(await adapter.read())
        cpu = time.process_time() - cpu0
    finally:
        await adapter.close()
    return cpu / values


async def _one_read_each(url: str, seconds: float) -> float:
    """CPU seconds per value with one Read request per variable."""
    client = await open_session(SessionSettings(url))
    try:
        ns = (await client.get_namespace_array()).index("urn:rackguard:cdu")
        names = (
            "SupplyTemperature",
            "ReturnTemperature",
            "Flow",
            "DifferentialPressure",
            "PumpSpeed",
            "PumpRunning",
            "Leak",
            "Alarm",
        )
        params = [
            ua.ReadParameters(
                MaxAge=0,
                TimestampsToReturn=ua.TimestampsToReturn.Both,
                NodesToRead=[
                    ua.ReadValueId(
                        NodeId=ua.NodeId.from_string(f"ns={ns};s=CDU-1.{name}"),
                        AttributeId=AttributeIds.Value,
                    )
                ],
            )
            for name in names
        ]
        values, cpu0 = 0, time.process_time()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for p in params:
                values += len(await client.uaclient.read(p))
        cpu = time.process_time() - cpu0
    finally:
        await close_session(client)
    return cpu / values


async def _rounds(url: str, seconds: float, repeats: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"subscription": [], "batched": [], "each": []}
    for _ in range(repeats):
        out["subscription"].append(await _subscription(url, seconds))
        out["batched"].append(await _batched(url, seconds / 4))
        out["each"].append(await _one_read_each(url, seconds / 4))
    return out


def measure(seconds: float = 4.0, repeats: int = 5) -> list[Row]:
    """Rows for `make bench`: client CPU per value, three ways, same run, medians."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.opcua_cost", "--serve", str(port)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the fake CDU server did not start")
        url = f"opc.tcp://127.0.0.1:{port}/rackguard/cdu"
        got = asyncio.run(_rounds(url, seconds, repeats))
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        if proc.poll() is None:
            proc.kill()
    each_us = median(got["each"]) * 1e6
    return [
        Row(
            "opcua batched Read: client CPU per value",
            median(got["batched"]) * 1e6,
            "us",
            reference_name="one Read per variable",
            reference=each_us,
            target="<= 1/2 of reference",
            ok=median(got["batched"]) * 2 <= median(got["each"]),
        ),
        Row(
            "opcua subscription: client CPU per notification",
            median(got["subscription"]) * 1e6,
            "us",
            reference_name="one Read per variable",
            reference=each_us,
            target="< reference",
            ok=median(got["subscription"]) < median(got["each"]),
        ),
    ]


def main() -> None:
    """`python -m bench.opcua_cost`: print the rows; `--serve PORT` runs the server side."""
    p = argparse.ArgumentParser(prog="python -m bench.opcua_cost")
    p.add_argument("--serve", type=int, metavar="PORT", help="run the fake CDU server")
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    if args.serve:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(_serve(args.serve, PERIOD_S))
        return
    print(render(measure(args.seconds, args.repeats)))


if __name__ == "__main__":
    main()
