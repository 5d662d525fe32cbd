"""This agent's membership in etcd: its lease, a watched copy of the fleet's keys, degraded mode.

The lease is refreshed every third of its TTL; every key under the prefix is
mirrored by a watch (read afresh after any break), so the breaker and rack
causes are seen as they change, not polled. When etcd cannot be reached the
agent says so once (WARNING), counts it, shows ``degraded`` and retries with a
capped backoff; nothing on the event loop waits on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable

from daemon.cluster.claims import Claims
from daemon.cluster.etcd import EtcdClient, EtcdError, EtcdUnavailable, Kv
from daemon.poller import Backoff

log = logging.getLogger(__name__)

Job = Callable[[], Awaitable[None]]

# Between reconnects: 0.5 s doubling to 5 s, each times 0.5-1.5.
RECONNECT = Backoff(0.5, 5.0, jitter=(0.5, 1.5))


class EtcdAgent:
    """Keeps the lease and the mirror; runs side jobs (trips, causes) off the decision path."""

    def __init__(
        self,
        client: EtcdClient,
        node: str,
        *,
        prefix: str = "/rackguard/",
        lease_ttl_s: int = 10,
        rng: random.Random | None = None,
    ) -> None:
        self.etcd = client
        self.node = node
        self.prefix = prefix
        self.lease_ttl_s = lease_ttl_s
        self.claims = Claims(client, node, prefix)
        self.cache: dict[str, Kv] = {}
        self.seen_at: dict[str, float] = {}  # monotonic time a key was first seen
        self.up = False
        self.failures = 0  # times etcd was found unreachable (a metric)
        self.last_error = ""
        self.changed = asyncio.Event()  # set on every mirrored change (tests, followers)
        self._jobs: asyncio.Queue[Job] = asyncio.Queue(maxsize=256)
        self._rng = rng or random.Random()

    # -- state ---------------------------------------------------------------------

    def mark_down(self, err: Exception) -> None:
        """etcd did not answer: degraded until the next good exchange."""
        self.failures += 1
        self.last_error = str(err)
        if self.up:
            log.warning(
                "%s: etcd unreachable, degraded (critical actions go ahead): %s", self.node, err
            )
        self.up = False

    def _mark_up(self) -> None:
        if not self.up:
            log.info("%s: etcd reachable (lease %x)", self.node, self.claims.lease)
        self.up = True

    def get(self, *parts: str) -> Kv | None:
        """A mirrored key, by its parts under the prefix."""
        return self.cache.get(self.claims.key(*parts))

    def under(self, *parts: str) -> list[Kv]:
        """Mirrored keys under a sub-prefix."""
        p = self.claims.key(*parts)
        return [kv for k, kv in self.cache.items() if k.startswith(p)]

    def submit(self, job: Job) -> None:
        """Run ``job`` soon, off the decision path; dropped while etcd is down or the queue full."""
        if self.up:
            with contextlib.suppress(asyncio.QueueFull):
                self._jobs.put_nowait(job)

    # -- tasks ---------------------------------------------------------------------

    async def run(self) -> None:
        """Lease, keepalive, mirror and side jobs until cancelled; reconnects after a failure."""
        # A session, not a poll: it lasts until etcd fails, so only the poller's
        # backoff is shared (daemon/poller.py), counted from the last good connect.
        failures = 0
        while True:
            try:
                if self.claims.lease == 0:
                    self.claims.lease = await self.etcd.grant(self.lease_ttl_s)
                kvs, revision = await self.etcd.get_prefix(self.prefix)
                self._reset_mirror(kvs)
                self._mark_up()
                failures = 0
                async with asyncio.TaskGroup() as tg:
                    tg.create_task(self._keepalive())
                    tg.create_task(self._watch(revision + 1))
                    tg.create_task(self._work())
            except* EtcdError as group:
                self.mark_down(group.exceptions[0])
            failures += 1
            await asyncio.sleep(RECONNECT.delay_s(failures, self._rng))

    async def _keepalive(self) -> None:
        while True:
            await asyncio.sleep(self.lease_ttl_s / 3)
            ttl = await self.etcd.keepalive(self.claims.lease)
            if ttl <= 0:
                # Expired (etcd was away longer than the TTL): our slots went with it.
                log.warning("%s: etcd lease expired; taking a new one", self.node)
                self.claims.lease = 0
                raise EtcdUnavailable("lease expired")

    async def _watch(self, revision: int) -> None:
        async for ev in self.etcd.watch(self.prefix, revision):
            if ev.kind == "DELETE":
                self.cache.pop(ev.kv.key, None)
                self.seen_at.pop(ev.kv.key, None)
            else:
                self.cache[ev.kv.key] = ev.kv
                self.seen_at.setdefault(ev.kv.key, time.monotonic())
            self.changed.set()

    async def _work(self) -> None:
        while True:
            job = await self._jobs.get()
            await job()

    def _reset_mirror(self, kvs: list[Kv]) -> None:
        now = time.monotonic()
        self.cache = {kv.key: kv for kv in kvs}
        self.seen_at = {k: self.seen_at.get(k, now) for k in self.cache}
        self.changed.set()

    async def close(self) -> None:
        """Give the lease back (our slots and causes go at once) and close the client."""
        if self.claims.lease and self.up:
            with contextlib.suppress(EtcdError, TimeoutError):
                async with asyncio.timeout(1.0):
                    await self.etcd.revoke(self.claims.lease)
        await self.etcd.close()
