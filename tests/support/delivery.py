"""A decision store and its deliverer opened together, as the daemon wires them; job notices."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from adapters.base import SchedulerSink
from adapters.schedulers.jobs import JobControl
from daemon.delivery.deliverer import Deliverer
from daemon.delivery.notices import JobNotices, NoticeSettings
from daemon.delivery.outbox import DecisionStore, Pending, Record, Status
from policies.model import REASON_PREFIX, Action, Decision, FaultDomain, idempotency_key


def decision(node: str, action: Action, epoch: int = 1) -> Decision:
    """A policy-made decision for ``node`` at ``epoch`` (its key as the policy makes it)."""
    return Decision(
        node,
        action,
        f"{REASON_PREFIX} test {action} #{epoch}",
        FaultDomain.GPU,
        float(epoch),
        idempotency_key(node, action, epoch),
    )


class StoreAndDeliverer:
    """``store`` and ``deliverer`` on one database; ``run()`` runs the deliverer."""

    def __init__(self, path: Path | str, sink: SchedulerSink | None, **kw: Any) -> None:
        store_kw = {k: kw.pop(k) for k in ("wall", "on_loop") if k in kw}
        self.store = DecisionStore(path, **store_kw)
        self.deliverer = Deliverer(self.store, sink, **kw)

    def submit(self, decision: Decision) -> asyncio.Future[str | None]:
        return self.store.submit(decision)

    async def run(self) -> None:
        await self.deliverer.run()

    def pending(self) -> list[Pending]:
        return self.store.pending()

    async def history(self, limit: int = 100) -> list[Record]:
        return await self.store.history(limit)

    @property
    def confirmed(self) -> dict[str, Action]:
        return self.store.confirmed

    @property
    def failed(self) -> list[tuple[Decision, str]]:
        return self.store.failed

    @property
    def on_settled(self) -> Callable[[Decision, Status, str], None] | None:
        return self.deliverer.on_settled

    @on_settled.setter
    def on_settled(self, fn: Callable[[Decision, Status, str], None] | None) -> None:
        self.deliverer.on_settled = fn

    def close(self) -> None:
        self.store.close()


@contextlib.asynccontextmanager
async def notices_on(
    store: DecisionStore, jobs: JobControl, settings: NoticeSettings
) -> AsyncIterator[JobNotices]:
    """Job notices and their store running, the open notices loaded; stopped on exit."""
    n = JobNotices(store, jobs, settings)
    tasks = [asyncio.create_task(n.run()), asyncio.create_task(store.run())]
    try:
        await n.loaded.wait()
        yield n
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
