"""Reconciliation against the fake slurmrestd over HTTP: drift repaired, foreign holds
left alone, busy nodes skipped, read failures survived."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from adapters.schedulers.slurm.auth import JwtToken
from adapters.schedulers.slurm.client import SlurmClient
from adapters.schedulers.slurm.sink import SlurmSink
from daemon.delivery.reconcile import Finding, Reconciler
from fakes.slurmrestd import FakeSlurmrestd
from policies.model import REASON_PREFIX, Action, Decision, FaultDomain, idempotency_key
from tests.support.delivery import StoreAndDeliverer as Outbox
from tests.support.secrets import write_secret
from tests.support.wait import wait_until


def decision(node: str, action: Action, epoch: int = 1) -> Decision:
    return Decision(
        node,
        action,
        f"{REASON_PREFIX} reconcile {action}",
        FaultDomain.RACK,
        0.0,
        idempotency_key(node, action, epoch),
    )


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlurmrestd]:
    server = FakeSlurmrestd(("gpu01", "gpu02", "gpu03", "gpu04"))
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def sink(fake: FakeSlurmrestd, tmp_path: Path) -> AsyncIterator[SlurmSink]:
    token = tmp_path / "jwt"
    write_secret(token, "token-root")
    s = SlurmSink(SlurmClient(fake.url, token=JwtToken(token), timeout_s=2.0))
    yield s
    await s.close()


@pytest.fixture
def outbox(tmp_path: Path, sink: SlurmSink) -> Iterator[Outbox]:
    box = Outbox(tmp_path / "o.db", sink, retry_initial_s=0.01, retry_max_s=0.02)
    yield box
    box.close()


async def flush(outbox: Outbox) -> None:
    task = asyncio.create_task(outbox.run())
    try:
        await wait_until(lambda: not outbox.pending())
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_drift_is_repaired_and_foreign_holds_are_left_alone(
    fake: FakeSlurmrestd, sink: SlurmSink, outbox: Outbox, caplog: pytest.LogCaptureFixture
) -> None:
    for d in (
        decision("gpu01", Action.DRAIN),
        decision("gpu02", Action.EXCLUDE),
        decision("gpu03", Action.DRAIN),
    ):
        outbox.submit(d)
    await flush(outbox)
    outbox.submit(decision("gpu03", Action.RESUME, 2))
    await flush(outbox)
    fake.admin_resume("gpu01")  # an operator lifts our drain by hand
    fake.admin_drain("gpu02", "hw ticket 9")  # an admin takes over our excluded node
    fake.admin_drain("gpu03", f"{REASON_PREFIX} stale drain")  # our reason, not intended
    writes_before = len(fake.writes)
    reconciler = Reconciler(outbox.store, sink)
    with caplog.at_level(logging.WARNING):
        findings = {f.node: f.finding for f in await reconciler.reconcile_once()}
        again = {f.node: f.finding for f in await reconciler.reconcile_once()}
    assert findings == {
        "gpu01": Finding.DRIFTED,
        "gpu02": Finding.FOREIGN,
        "gpu03": Finding.DRIFTED,
    }
    # The repairs wait in the outbox, so the second round leaves those nodes to it.
    assert again == {"gpu01": Finding.BUSY, "gpu02": Finding.FOREIGN, "gpu03": Finding.BUSY}
    assert sum("left alone" in r.getMessage() for r in caplog.records) == 1  # once, not per round
    await flush(outbox)
    assert [(w.node, w.state) for w in fake.writes[writes_before:]] == [
        ("gpu01", "DRAIN"),
        ("gpu03", "RESUME"),
    ]
    assert fake.nodes["gpu02"].reason == "hw ticket 9"
    final = {f.node: f.finding for f in await reconciler.reconcile_once()}
    assert final == {"gpu01": Finding.IN_SYNC, "gpu02": Finding.FOREIGN, "gpu03": Finding.IN_SYNC}
    assert reconciler.repairs == 2


async def test_repeated_manual_resumes_are_repaired_every_time(
    fake: FakeSlurmrestd, sink: SlurmSink, outbox: Outbox
) -> None:
    outbox.submit(decision("gpu01", Action.DRAIN))
    await flush(outbox)
    reconciler = Reconciler(outbox.store, sink)
    for round_ in range(3):  # the second repair once collided on its key and crashed
        fake.admin_resume("gpu01")
        findings = {f.node: f.finding for f in await reconciler.reconcile_once()}
        assert findings == {"gpu01": Finding.DRIFTED}, round_
        await flush(outbox)
        assert "DRAIN" in fake.nodes["gpu01"].flags, round_
    keys = [r.decision.key for r in (await outbox.history(10))]
    assert len(keys) == len(set(keys)) == 4


async def test_each_round_updates_the_state_last_read_back_and_when(
    fake: FakeSlurmrestd, sink: SlurmSink, outbox: Outbox
) -> None:
    outbox.submit(decision("gpu01", Action.DRAIN))
    await flush(outbox)
    delivered = outbox.deliverer.read_back["gpu01"]
    reconciler = Reconciler(outbox.store, sink, on_read=outbox.deliverer.note_read_back)
    await asyncio.sleep(0.05)
    fake.admin_resume("gpu01")  # the scheduler changed: the page shows it from this round
    await reconciler.reconcile_once()
    seen = outbox.deliverer.read_back["gpu01"]
    assert seen.at > delivered.at
    assert seen.state != delivered.state and "DRAIN" not in seen.state.upper()
    del fake.nodes["gpu01"]  # unknown to the scheduler: nothing read back to show
    await reconciler.reconcile_once()
    assert outbox.deliverer.read_back["gpu01"] == seen


async def test_unknown_nodes_are_reported_not_repaired(
    sink: SlurmSink, outbox: Outbox, fake: FakeSlurmrestd
) -> None:
    outbox.submit(decision("gpu01", Action.DRAIN))
    await flush(outbox)
    del fake.nodes["gpu01"]  # taken out of the scheduler's configuration
    writes = len(fake.writes)
    findings = await Reconciler(outbox.store, sink).reconcile_once()
    assert [(f.node, f.finding) for f in findings] == [("gpu01", Finding.UNKNOWN_NODE)]
    assert outbox.pending() == [] and len(fake.writes) == writes


async def test_run_survives_an_unreadable_scheduler(
    fake: FakeSlurmrestd, sink: SlurmSink, outbox: Outbox
) -> None:
    outbox.submit(decision("gpu01", Action.DRAIN))
    await flush(outbox)
    fake.admin_resume("gpu01")
    await fake.stop()
    reconciler = Reconciler(outbox.store, sink, interval_s=0.2)
    task = asyncio.create_task(reconciler.run())
    try:
        await wait_until(lambda: reconciler.poller.stats.failures >= 2, what="two failed rounds")
        assert outbox.pending() == []
        await fake.start()
        await wait_until(outbox.pending)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert [p.origin for p in outbox.pending()] == ["reconcile"]
