"""This agent's membership in etcd: its lease, a watched copy of the fleet's keys, degraded mode.

The lease is refreshed every third of its TTL; every key under the prefix is
mirrored by a watch (read afresh after any break), so the breaker and rack
causes are seen as they change, not polled. When etcd cannot be reached the
agent says so once (WARNING), counts it, shows ``degraded`` and retries with a
capped backoff; nothing on the event loop waits on it. Any good answer from
etcd while the session (lease, watch) lives brings it back up: a claim that
timed out in a stall does not leave the agent degraded.

The lease is trusted only until the time etcd last promised (sent + TTL, on
this host's monotonic clock): an agent whose event loop stalled past it is
not ``up``, acts on no claim, and takes a new lease (revoking the old one).
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
from daemon.cluster.etcd_values import Values
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
        self.values = Values(node)
        self.claims = Claims(client, node, prefix, self.values)
        self.cache: dict[str, Kv] = {}
        self.seen_at: dict[str, float] = {}  # monotonic time a key was first seen
        # Monotonic time the current revision of a key arrived by the watch; a key
        # read in a full (re)read has none: when it was written is not known here.
        self.put_at: dict[str, float] = {}
        self._up = False
        self._live = False  # the session (keepalive, watch) is running
        self.lease_until = 0.0  # monotonic: etcd promised the lease until then
        self.failures = 0  # times etcd was found unreachable (a metric)
        self.last_error = ""
        self.changed = asyncio.Event()  # set on every mirrored change (tests, followers)
        self._jobs: asyncio.Queue[Job] = asyncio.Queue(maxsize=256)
        self._rng = rng or random.Random()
        self._stale_lease = 0  # a lease given up after a stall, to revoke
        self._probe = asyncio.Event()  # set by mark_down: ask etcd now, not in TTL/3

    # -- state ---------------------------------------------------------------------

    @property
    def up(self) -> bool:
        """etcd answers and this agent's lease is still promised to it."""
        return self._up and self.claims.lease != 0 and time.monotonic() < self.lease_until

    @up.setter
    def up(self, value: bool) -> None:
        self._up = value

    def mark_down(self, err: Exception) -> None:
        """etcd did not answer: degraded until the next good exchange."""
        self.failures += 1
        self.last_error = str(err)
        if self._up:
            log.warning(
                "%s: etcd unreachable, degraded (critical actions go ahead): %s", self.node, err
            )
        self._up = False
        self._probe.set()

    def _mark_up(self) -> None:
        if not self._up:
            log.info("%s: etcd reachable (lease %x)", self.node, self.claims.lease)
        self._up = True

    def _answered(self, path: str) -> None:
        """The client's hook: etcd answered a call; back up if the session lives."""
        if self._live and path != "/v3/lease/keepalive":  # keepalive judges its own answer
            self._mark_up()

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
        self.etcd.answered = self._answered
        while True:
            try:
                if self._stale_lease:
                    # Ours no more: whatever it still holds goes now, not in a TTL.
                    with contextlib.suppress(EtcdUnavailable):
                        with contextlib.suppress(EtcdError):  # already expired: gone anyway
                            await self.etcd.revoke(self._stale_lease)
                        self._stale_lease = 0
                if self.claims.lease != 0:
                    # A reconnect: a restarted etcd may have lost the lease with its data.
                    sent = time.monotonic()
                    ttl = await self.etcd.keepalive(self.claims.lease)
                    if ttl > 0:
                        self.lease_until = sent + ttl
                    else:
                        log.warning("%s: etcd lost our lease; taking a new one", self.node)
                        self.claims.lease = 0
                if self.claims.lease == 0:
                    sent = time.monotonic()
                    self.claims.lease = await self.etcd.grant(self.lease_ttl_s)
                    self.lease_until = sent + self.lease_ttl_s
                kvs, revision = await self.etcd.get_prefix(self.prefix)
                self._reset_mirror(kvs)
                self._mark_up()
                failures = 0
                self._live = True
                async with asyncio.TaskGroup() as tg:
                    tg.create_task(self._keepalive())
                    tg.create_task(self._watch(revision + 1))
                    tg.create_task(self._work())
            except* EtcdError as group:
                self.mark_down(group.exceptions[0])
            finally:
                self._live = False
            failures += 1
            await asyncio.sleep(RECONNECT.delay_s(failures, self._rng))

    async def _keepalive(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.lease_ttl_s / 3):
                    await self._probe.wait()
            self._probe.clear()
            sent = time.monotonic()
            if sent >= self.lease_until:
                # This agent did not run for longer than the lease: whatever etcd
                # says now, every claim made under it may have gone to a peer.
                log.warning(
                    "%s: event loop stalled past the etcd lease (%.1fs late); taking a new one",
                    self.node,
                    sent - self.lease_until,
                )
                self._stale_lease, self.claims.lease = self.claims.lease, 0
                raise EtcdUnavailable("lease overdue: this agent stalled past its TTL")
            ttl = await self.etcd.keepalive(self.claims.lease)
            if ttl <= 0:
                # Expired (etcd was away longer than the TTL, or lost its data).
                log.warning("%s: etcd lease expired; taking a new one", self.node)
                self.claims.lease = 0
                raise EtcdUnavailable("lease expired")
            self.lease_until = sent + ttl
            self._mark_up()

    async def _watch(self, revision: int) -> None:
        async for ev in self.etcd.watch(self.prefix, revision):
            if ev.kind == "DELETE":
                self.cache.pop(ev.kv.key, None)
                self.seen_at.pop(ev.kv.key, None)
                self.put_at.pop(ev.kv.key, None)
            else:
                now = time.monotonic()
                self.cache[ev.kv.key] = ev.kv
                self.seen_at.setdefault(ev.kv.key, now)
                self.put_at[ev.kv.key] = now
            self._mark_up()
            self.changed.set()

    async def _work(self) -> None:
        while True:
            job = await self._jobs.get()
            await job()

    def _reset_mirror(self, kvs: list[Kv]) -> None:
        now = time.monotonic()
        old = self.cache
        self.cache = {kv.key: kv for kv in kvs}
        self.seen_at = {k: self.seen_at.get(k, now) for k in self.cache}
        self.put_at = {
            k: t
            for k, t in self.put_at.items()
            if k in self.cache and k in old and old[k].mod_revision == self.cache[k].mod_revision
        }
        self.changed.set()

    async def close(self) -> None:
        """Give the lease back (our slots and causes go at once) and close the client."""
        if self.claims.lease and self.up:
            with contextlib.suppress(EtcdError, TimeoutError):
                async with asyncio.timeout(1.0):
                    await self.etcd.revoke(self.claims.lease)
        await self.etcd.close()
