"""The durable outbox against a fake slurmrestd over real HTTP: durability, coalescing,
read-before-write, read-back, ordering, and a ten-minute outage in simulated time."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from adapters.schedulers.slurm.auth import JwtToken
from adapters.schedulers.slurm.client import SlurmClient
from adapters.schedulers.slurm.sink import SlurmSink
from daemon.delivery.database import OutboxBusy
from daemon.delivery.outbox import DecisionStore, Status
from fakes.slurmrestd import FakeSlurmrestd
from policies.model import REASON_PREFIX, Action, idempotency_key
from tests.support.delivery import StoreAndDeliverer as Outbox
from tests.support.delivery import decision
from tests.support.secrets import write_secret
from tests.support.wait import wait_until

NODES = ("gpu01", "gpu02", "gpu03", "gpu04")


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlurmrestd]:
    server = FakeSlurmrestd(NODES)
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "jwt"
    write_secret(path, "token-root\n")
    return path


@pytest.fixture
async def sink(fake: FakeSlurmrestd, token_file: Path) -> AsyncIterator[SlurmSink]:
    s = SlurmSink(
        SlurmClient(fake.url, token=JwtToken(token_file), timeout_s=2.0), exclude_state="down"
    )
    yield s
    await s.close()


@pytest.fixture
def opened(tmp_path: Path) -> Iterator[Callable[..., Outbox]]:
    """Outboxes on tmp_path/o.db (by default), closed at teardown."""
    boxes: list[Outbox] = []

    def make(sink: SlurmSink | None, **kw: Any) -> Outbox:
        kw.setdefault("retry_initial_s", 0.01)
        kw.setdefault("retry_max_s", 0.02)
        box = Outbox(kw.pop("path", tmp_path / "o.db"), sink, **kw)
        boxes.append(box)
        return box

    yield make
    for box in boxes:
        box.close()


async def start(outbox: Outbox) -> asyncio.Task[None]:
    task = asyncio.create_task(outbox.run())
    await asyncio.sleep(0)
    return task


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def drained(outbox: Outbox) -> None:
    await wait_until(lambda: not outbox.pending())


async def test_pending_decisions_survive_a_restart(tmp_path: Path) -> None:
    db = tmp_path / "outbox.sqlite3"
    first = DecisionStore(db)
    k1 = await first.submit(decision("gpu01", Action.DRAIN))
    k2 = await first.submit(decision("gpu02", Action.EXCLUDE))
    first.close()
    second = DecisionStore(db)
    try:
        got = [(p.decision.node, p.decision.action, p.decision.key) for p in second.pending()]
        assert got == [("gpu01", Action.DRAIN, k1), ("gpu02", Action.EXCLUDE, k2)]
        assert all(p.durable for p in second.pending())
        assert second.pending()[0].decision.reason == f"{REASON_PREFIX} test drain #1"
        assert second._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        second.close()


def test_a_second_process_cannot_open_the_same_outbox(tmp_path: Path) -> None:
    db = tmp_path / "outbox.sqlite3"
    first = DecisionStore(db)
    try:
        with pytest.raises(OutboxBusy):
            DecisionStore(db)
    finally:
        first.close()
    DecisionStore(db).close()  # free again once closed


async def test_keys_are_unique_across_restarts(tmp_path: Path) -> None:
    # The policy's epochs restart with the process, so its keys repeat across restarts.
    keys = []
    for _ in range(2):
        store = DecisionStore(tmp_path / "o.db")
        try:
            keys.append(await store.submit(decision("gpu01", Action.DRAIN, 1)))
            keys.append(await store.submit(decision("gpu01", Action.RESUME, 2)))
            assert store.intents()["gpu01"].key == keys[-1]
        finally:
            store.close()
    assert len(set(keys)) == 4
    assert all(k and k.startswith(idempotency_key("gpu01", Action.DRAIN, 1)) for k in keys[::2])


async def test_coalescing_keeps_only_what_is_still_needed(tmp_path: Path) -> None:
    outbox = DecisionStore(tmp_path / "o.db")
    try:
        outbox.submit(decision("gpu01", Action.DRAIN, 1))
        outbox.submit(decision("gpu02", Action.DRAIN, 1))
        outbox.submit(decision("gpu01", Action.RESUME, 2))  # never sent: nothing to undo
        await outbox.submit(decision("gpu02", Action.EXCLUDE, 2))  # replaces the drain
        assert [(p.decision.node, p.decision.action) for p in outbox.pending()] == [
            ("gpu02", Action.EXCLUDE)
        ]
        statuses = [
            (r.decision.node, r.decision.action, r.status) for r in (await outbox.history())
        ]
        assert statuses == [
            ("gpu02", Action.EXCLUDE, Status.PENDING),
            ("gpu01", Action.RESUME, Status.SUPERSEDED),
            ("gpu02", Action.DRAIN, Status.SUPERSEDED),
            ("gpu01", Action.DRAIN, Status.SUPERSEDED),
        ]
        # The intent is still recorded: gpu01 should be in service.
        assert outbox.intents()["gpu01"].action is Action.RESUME
    finally:
        outbox.close()


async def test_delivery_writes_then_reads_back(
    opened: Callable[..., Outbox], fake: FakeSlurmrestd, sink: SlurmSink
) -> None:
    outbox = opened(sink)
    task = await start(outbox)
    try:
        outbox.submit(decision("gpu01", Action.DRAIN))
        outbox.submit(decision("gpu02", Action.EXCLUDE))
        await drained(outbox)
    finally:
        await stop(task)
    assert [(w.node, w.state, w.after) for w in fake.writes] == [
        ("gpu01", "DRAIN", "IDLE+DRAIN"),
        ("gpu02", "DOWN", "DOWN"),
    ]
    assert fake.nodes["gpu01"].reason == "rackguard[gpu]: test drain #1"
    assert outbox.confirmed == {"gpu01": Action.DRAIN, "gpu02": Action.EXCLUDE}
    assert all(r.outcome.startswith("read back") for r in (await outbox.history()))


async def test_a_node_already_as_intended_is_not_written_again(
    opened: Callable[..., Outbox], fake: FakeSlurmrestd, sink: SlurmSink
) -> None:
    # As after a kill -9 between the scheduler applying a drain and the outbox noting it.
    fake.nodes["gpu01"].flags.append("DRAIN")
    fake.nodes["gpu01"].reason = f"{REASON_PREFIX} test drain #1"
    outbox = opened(sink)
    task = await start(outbox)
    try:
        outbox.submit(decision("gpu01", Action.DRAIN))
        outbox.submit(decision("gpu03", Action.RESUME))  # in service already
        await drained(outbox)
    finally:
        await stop(task)
    assert fake.writes == []
    assert [r.status for r in (await outbox.history())] == [Status.CONFIRMED, Status.CONFIRMED]
    assert (await outbox.history())[1].outcome.startswith("already drained")


async def test_a_node_drained_by_someone_else_is_left_alone(
    opened: Callable[..., Outbox], fake: FakeSlurmrestd, sink: SlurmSink
) -> None:
    fake.admin_drain("gpu02", "maint ticket-1")
    outbox = opened(sink)
    task = await start(outbox)
    try:
        outbox.submit(decision("gpu02", Action.EXCLUDE))
        await drained(outbox)
        outbox.submit(decision("gpu02", Action.RESUME, 2))  # must never lift the admin's drain
        outbox.submit(decision("gpu03", Action.DRAIN))
        await drained(outbox)
    finally:
        await stop(task)
    assert [w.node for w in fake.writes] == ["gpu03"]
    node = fake.nodes["gpu02"]
    assert node.flags == ["DRAIN"] and node.reason == "maint ticket-1"
    skipped = [r for r in (await outbox.history()) if r.status is Status.SKIPPED]
    assert [r.decision.action for r in skipped] == [Action.RESUME, Action.EXCLUDE]
    assert all("maint ticket-1" in r.outcome for r in skipped)


async def test_an_unconfirmed_write_is_retried_until_read_back(
    opened: Callable[..., Outbox], fake: FakeSlurmrestd, sink: SlurmSink
) -> None:
    fake.drop_writes = 2  # answers 200 twice without applying
    outbox = opened(sink)
    task = await start(outbox)
    try:
        outbox.submit(decision("gpu01", Action.DRAIN))
        await drained(outbox)
    finally:
        await stop(task)
    (record,) = await outbox.history()
    assert record.status is Status.CONFIRMED and record.attempts == 3
    assert len(fake.writes) == 1 and fake.nodes["gpu01"].flags == ["DRAIN"]


async def test_an_unknown_node_is_retried_slowly_until_an_operator_registers_it(
    opened: Callable[..., Outbox], fake: FakeSlurmrestd, sink: SlurmSink
) -> None:
    outbox = opened(sink)
    task = await start(outbox)
    try:
        outbox.submit(decision("gpu99", Action.DRAIN))
        await wait_until(lambda: outbox.deliverer.refusal)
        assert "does not know this node" in outbox.deliverer.refusal
        await wait_until(
            lambda: len([p for _, p in fake.requests if p.endswith("/node/gpu99")]) > 2
        )
        assert [p.decision.node for p in outbox.pending()] == ["gpu99"]
        assert outbox.deliverer.failures["not_found"] >= 1
        ok, reason = outbox.deliverer.health()[0]
        assert not ok and "not_found" in reason
    finally:
        await stop(task)
    assert not outbox.failed and fake.writes == []


async def test_a_write_that_may_have_landed_is_not_coalesced_away(
    opened: Callable[..., Outbox], fake: FakeSlurmrestd, token_file: Path
) -> None:
    # The drain is applied but its answer never comes (timeout): the scheduler has
    # it, rackguard cannot know, so the resume after it must still be sent.
    fake.slow_writes, fake.slow_write_s = 1, 1.0
    sink = SlurmSink(SlurmClient(fake.url, token=JwtToken(token_file), timeout_s=0.3))
    outbox = opened(sink, retry_initial_s=5.0, retry_max_s=5.0)
    task = await start(outbox)
    try:
        outbox.submit(decision("gpu01", Action.DRAIN))
        await wait_until(lambda: outbox.pending()[0].last_error)
        assert fake.nodes["gpu01"].flags == ["DRAIN"]
        outbox.submit(decision("gpu01", Action.RESUME, 2))
        assert [p.decision.action for p in outbox.pending()] == [Action.RESUME]
    finally:
        await stop(task)
        await sink.close()


class SimTime:
    """Simulated time for the outbox's backoff sleeps; the test moves it forward."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []
        self._waiter: tuple[float, asyncio.Future[bool]] | None = None

    async def sleep(self, delay: float, wake: asyncio.Event) -> None:
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiter = (self.now + delay, fut)
        self.slept.append(delay)
        woken: asyncio.Future[bool] = asyncio.ensure_future(wake.wait())
        try:
            await asyncio.wait([fut, woken], return_when=asyncio.FIRST_COMPLETED)
        finally:
            woken.cancel()
            await asyncio.gather(woken, return_exceptions=True)
            if self._waiter is not None and self._waiter[1] is fut:
                self._waiter = None

    async def sleeping(
        self, idle: Callable[[], bool] = lambda: False
    ) -> tuple[float, asyncio.Future[bool]] | None:
        """The sleep in progress once the outbox is in one; None if ``idle()`` first."""
        async with asyncio.timeout(10):
            while self._waiter is None or self._waiter[1].done():
                if idle():
                    return None
                await asyncio.sleep(0.001)
        return self._waiter

    async def advance(
        self,
        seconds: float,
        at: Callable[[float], Awaitable[None]] | None = None,
        idle: Callable[[], bool] = lambda: False,
    ) -> None:
        """Let ``seconds`` pass, waking each sleep due meanwhile; ``at(now)`` runs before each."""
        end = self.now + seconds
        while True:
            waiter = await self.sleeping(idle)
            if waiter is None or waiter[0] > end:
                break
            self.now = waiter[0]
            if at is not None:
                await at(self.now)
            waiter[1].set_result(True)
            await asyncio.sleep(0)
        self.now = end


async def test_ten_minute_outage_queues_survives_restart_coalesces_and_delivers_in_order(
    tmp_path: Path, token_file: Path
) -> None:
    fake = FakeSlurmrestd(NODES)
    await fake.start()
    await fake.stop()  # the scheduler is unreachable from the start
    outage_s = 600.0
    db = tmp_path / "outbox.sqlite3"
    clock = SimTime()

    async def scheduler_returns(now: float) -> None:
        if now >= outage_s and fake.url and not fake.writes and fake._runner is None:
            await fake.start()

    def open_outbox() -> tuple[Outbox, SlurmSink]:
        sink = SlurmSink(
            SlurmClient(fake.url, token=JwtToken(token_file), timeout_s=1.0), exclude_state="down"
        )
        box = Outbox(
            db, sink, retry_initial_s=1.0, retry_max_s=60.0, rng=random.Random(6), sleep=clock.sleep
        )
        return box, sink

    outbox, sink = open_outbox()
    task = await start(outbox)
    try:
        outbox.submit(decision("gpu01", Action.DRAIN, 1))
        outbox.submit(decision("gpu02", Action.DRAIN, 1))
        outbox.submit(decision("gpu03", Action.EXCLUDE, 1))
        await clock.advance(120)
        backlog = outbox.pending()
        assert [(p.decision.node, p.decision.action) for p in backlog] == [
            ("gpu01", Action.DRAIN),
            ("gpu02", Action.DRAIN),
            ("gpu03", Action.EXCLUDE),
        ]
        assert backlog[0].attempts >= 3 and "slurmrestd" in backlog[0].last_error
        outbox.submit(decision("gpu02", Action.RESUME, 2))  # never sent: both vanish
        outbox.submit(decision("gpu01", Action.EXCLUDE, 2))  # the drain was attempted: kept
        outbox.submit(decision("gpu04", Action.DRAIN, 1))
        await clock.advance(180)
        # rackguard restarts in the middle of the outage
        await stop(task)
        outbox.close()
        await sink.close()
        outbox, sink = open_outbox()
        task = await start(outbox)
        assert [(p.decision.node, p.decision.action) for p in outbox.pending()] == [
            ("gpu03", Action.EXCLUDE),
            ("gpu01", Action.EXCLUDE),
            ("gpu04", Action.DRAIN),
        ]
        await clock.sleeping()  # not in the middle of an attempt
        outbox.submit(decision("gpu03", Action.DRAIN, 2))  # de-escalated before delivery
        await clock.advance(outage_s - clock.now - 1)
        assert fake.writes == []
        assert [(p.decision.node, p.decision.action) for p in outbox.pending()] == [
            ("gpu01", Action.EXCLUDE),
            ("gpu04", Action.DRAIN),
            ("gpu03", Action.DRAIN),
        ]
        box = outbox
        await clock.advance(120, at=scheduler_returns, idle=lambda: not box.pending())
        await drained(outbox)
    finally:
        await stop(task)
        await sink.close()
        await fake.stop()
    assert [(w.node, w.state) for w in fake.writes] == [
        ("gpu01", "DOWN"),
        ("gpu04", "DRAIN"),
        ("gpu03", "DRAIN"),
    ]
    assert fake.nodes["gpu02"].held() == "IDLE"
    # Capped exponential backoff: never more than retry_max_s, and it kept trying.
    assert max(clock.slept) <= 60.0
    assert 10 <= len(clock.slept) <= 40
