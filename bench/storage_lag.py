"""Event-loop lag while 1,000 decisions are stored and delivered: the writer thread vs the loop.

The same run twice on a file in a temporary directory (WAL, synchronous=FULL,
so every commit waits for the disk): once with the decision store on its writer
thread (as the daemon runs it), once with every statement on the event loop (as
before the writer thread). A probe task sleeps 1 ms in a loop and records how
late it wakes: that lateness is what polling, the API and the watchdog would
suffer. The sink confirms at once, so storage is all the work there is.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

from bench.delivery_latency import percentile
from bench.report import Row
from daemon.delivery.deliverer import Deliverer
from daemon.delivery.outbox import DecisionStore, Status
from policies.model import REASON_PREFIX, Action, Decision, FaultDomain, idempotency_key

DECISIONS = 1000
PROBE_S = 0.001


class _InstantSink:
    """A scheduler that accepts everything at once (no read-back)."""

    name = "instant"

    async def deliver(self, decision: Decision) -> None:
        return None

    async def close(self) -> None:
        return None


async def _run(db: Path, *, on_loop: bool, decisions: int) -> tuple[list[float], float, float]:
    """(lags in ms, commits per decision, total seconds)."""
    store = DecisionStore(db, on_loop=on_loop)
    settled = asyncio.Event()
    statuses: list[Status] = []

    def on_settled(decision: Decision, status: Status, outcome: str) -> None:
        statuses.append(status)
        settled.set()

    deliverer = Deliverer(store, _InstantSink(), on_settled=on_settled)
    lags: list[float] = []
    stop = asyncio.Event()

    async def probe() -> None:
        while not stop.is_set():
            t0 = time.perf_counter()
            await asyncio.sleep(PROBE_S)
            lags.append(max(0.0, time.perf_counter() - t0 - PROBE_S) * 1000)

    tasks = [asyncio.create_task(deliverer.run()), asyncio.create_task(probe())]
    commits0 = store.commits
    t0 = time.perf_counter()
    try:
        for i in range(decisions):
            action = Action.DRAIN if i % 2 == 0 else Action.RESUME
            settled.clear()
            store.submit(
                Decision(
                    "gpu01",
                    action,
                    f"{REASON_PREFIX} bench #{i}",
                    FaultDomain.GPU,
                    float(i),
                    idempotency_key("gpu01", action, i + 1),
                )
            )
            await settled.wait()
    finally:
        total = time.perf_counter() - t0
        stop.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        commits = store.commits - commits0
        store.close()
    if len(statuses) != decisions or any(s is not Status.CONFIRMED for s in statuses):
        raise RuntimeError("bench: not every decision was confirmed")
    return lags, commits / decisions, total


def measure(decisions: int = DECISIONS) -> list[Row]:
    """Lag p99 / max with the writer thread against storage on the loop; commits per decision."""
    with tempfile.TemporaryDirectory() as tmp:
        thread, per_thread, s_thread = asyncio.run(
            _run(Path(tmp) / "thread.db", on_loop=False, decisions=decisions)
        )
        loop, per_loop, s_loop = asyncio.run(
            _run(Path(tmp) / "loop.db", on_loop=True, decisions=decisions)
        )
    ref = f"storage on the loop, {decisions} decisions"
    name = f"event-loop lag, storage on the writer thread, {decisions} decisions"
    return [
        Row(f"{name} p99", percentile(thread, 99), "ms", f"{ref} p99", percentile(loop, 99)),
        Row(f"{name} max", max(thread), "ms", f"{ref} max", max(loop)),
        Row("commits per delivered decision (webhook-like sink)", per_thread, "", ref, per_loop),
        Row("1,000 decisions stored and delivered, writer thread", s_thread, "s", ref, s_loop),
    ]


if __name__ == "__main__":
    from bench.report import render

    print(render(measure()))
