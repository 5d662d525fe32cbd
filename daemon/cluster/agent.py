"""This agent's membership in etcd: a watched copy of the fleet's keys, a lease when it holds one.

Every key under the prefix is mirrored by a watch (read afresh after any
break), so the breaker and rack causes are seen as they change, not polled.

A lease is held only while something must expire with this agent: a drain
slot, a rack-wide cause, a rack's or the view's leadership (``hold_lease``
grants one on demand; it is given back once no mirrored key is bound to it
for a TTL). Only then is it refreshed, every third of its TTL. A follower
that merely watches sends etcd nothing at steady state: the view reader's
``view/at`` arrives every ``view_interval_s`` and shows the watch alive. After
``quiet_s`` without a word from etcd it asks once (a count of the keys changed
since the mirror's revision: none, or the watch is stuck and is opened again).
Per fleet, etcd serves a keepalive per holder, not per agent (docs/fleet.md).

When etcd cannot be reached the agent says so once (WARNING), counts it, shows
``degraded`` and retries with a capped backoff; nothing on the event loop waits
on it. Any good answer from etcd while the session (watch) lives brings it back
up: a claim that timed out in a stall does not leave the agent degraded.

A lease is trusted only until the time etcd last promised (sent + TTL, on this
host's monotonic clock): an agent whose event loop stalled past it is not
``up``, acts on no claim, and lets the old lease go (revoked on reconnect).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable

from adapters.timeouts import time_limit
from daemon.cluster.claims import Claims
from daemon.cluster.etcd import (
    EtcdClient,
    EtcdError,
    EtcdUnavailable,
    Kv,
    absent,
    b64,
    get_op,
    put_op,
    ranges,
)
from daemon.cluster.etcd_values import Values
from daemon.loops import stop_requested
from daemon.poller import Backoff

log = logging.getLogger(__name__)

Job = Callable[[], Awaitable[None]]

# An election's candidates per third of a TTL (a rack's agents, typically).
RACK_SIZE = 40

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
        quiet_s: float | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.etcd = client
        self.node = node
        self.prefix = prefix
        self.lease_ttl_s = lease_ttl_s
        # A watcher asks etcd after this long without a word from it (default 3 TTLs).
        self.quiet_s = quiet_s if quiet_s is not None else 3.0 * lease_ttl_s
        self.values = Values(node)
        self.claims = Claims(client, node, prefix, self.values)
        self.claims.acquire = self.hold_lease
        self.cache: dict[str, Kv] = {}
        self.seen_at: dict[str, float] = {}  # monotonic time a key was first seen
        # Monotonic time the current revision of a key arrived by the watch; a key
        # read in a full (re)read has none: when it was written is not known here.
        self.put_at: dict[str, float] = {}
        self._up = False
        self._live = False  # the session (keepalive, watch) is running
        self.lease_until = 0.0  # monotonic: etcd promised the lease until then
        self._renewed_at = 0.0  # monotonic: the last grant or keepalive was sent
        self._needed_until = 0.0  # monotonic: a claim or election under way needs the lease
        self._lease_lock = asyncio.Lock()
        self.heard_at = 0.0  # monotonic: etcd's last answer or watch event
        self.watched_at = 0.0  # monotonic: the last watch event (or the mirror's read)
        self.grants = 0  # leases taken (a metric: at steady state, holders only)
        self._vacant: dict[str, float] = {}  # leadership key seen free -> when to stand for it
        self.rack = ""  # whose rack evidence is watched (set by the RackLeader; "": none)
        self._watched: list[int] = []  # per watched span: complete up to this revision
        self.failures = 0  # times etcd was found unreachable (a metric)
        self.last_error = ""
        self.changed = asyncio.Event()  # set on every mirrored change (tests, followers)
        self._jobs: asyncio.Queue[Job] = asyncio.Queue(maxsize=256)
        self._rng = rng or random.Random()
        self._stale_lease = 0  # a lease given up after a stall, to revoke
        self._wake = asyncio.Event()  # the keepalive's due time may have moved
        self._probe = False  # set by mark_down: ask etcd now, not when due

    # -- state ---------------------------------------------------------------------

    @property
    def up(self) -> bool:
        """etcd answers, and the lease this agent holds (if any) is still promised to it."""
        return self._up and (self.claims.lease == 0 or time.monotonic() < self.lease_until)

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
        self._probe = True
        self._wake.set()

    def _mark_up(self) -> None:
        if not self._up:
            log.info("%s: etcd reachable (lease %x)", self.node, self.claims.lease)
        self._up = True

    def _answered(self, path: str) -> None:
        """The client's hook: etcd answered a call; back up if the session lives."""
        self.heard_at = time.monotonic()
        if self._live and path != "/v3/lease/keepalive":  # keepalive judges its own answer
            self._mark_up()

    async def hold_lease(self) -> int:
        """This agent's lease, granted now if it holds none; kept while something is bound to it."""
        async with self._lease_lock:
            if self.claims.lease == 0:
                if not self._live:
                    raise EtcdUnavailable("not connected to etcd (reconnecting)")
                sent = time.monotonic()
                lease = await self.etcd.grant(self.lease_ttl_s)
                self.claims.lease, self.lease_until, self._renewed_at = (
                    lease,
                    sent + self.lease_ttl_s,
                    sent,
                )
                self.grants += 1
                self._wake.set()  # refreshed from now on
            self._needed_until = time.monotonic() + self.lease_ttl_s
            return self.claims.lease

    def holds(self, kv: Kv | None) -> bool:
        """The key is this agent's, bound to the lease it holds now (an older lease's is not)."""
        lease = self.claims.lease
        return (
            kv is not None and lease != 0 and kv.lease == lease and kv.value == self.node.encode()
        )

    async def stand(self, *parts: str, candidates: int = 1) -> bool:
        """Hold a leadership key (``leader/<rack>``, ``viewer``) under the lease: True while ours.

        A leadership held under an older lease (etcd lost it, or this agent stalled
        past it) is not ours: the key goes with that lease, and then we stand again.
        """
        if not self.up:
            return False
        held = self.get(*parts)
        key = self.claims.key(*parts)
        if held is not None:
            self._vacant.pop(key, None)
            return self.holds(held)
        # Not the whole rack (or fleet) at once, as after a wipe or a fleet-wide start:
        # each stands at its own time within a third of a TTL per RACK_SIZE of the
        # ``candidates``; the first one's key reaches the others through the watch
        # before more than a few more are due, however many stand.
        now = time.monotonic()
        window = self.lease_ttl_s / 3 * max(1.0, candidates / RACK_SIZE)
        if now < self._vacant.setdefault(key, now + self._rng.uniform(0, window)):
            return False
        try:
            lease = await self.hold_lease()
            ok, responses = await self.etcd.txn(
                [absent(key)], [put_op(key, self.node, lease)], [get_op(key)]
            )
        except EtcdError as err:
            self.mark_down(err)
            return False
        # Lost the race, or won it an instant ago and the watch has not brought it yet.
        return ok or any(self.holds(kv) for kvs in ranges(responses) for kv in kvs)

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
                        self.lease_until, self._renewed_at = sent + ttl, sent
                    else:
                        log.warning("%s: etcd lost our lease and what it held", self.node)
                        self.claims.lease = 0
                spans = self.spans()
                kvs, revision = await self.etcd.get_ranges(spans)
                self._reset_mirror(kvs)
                self._watched = [revision] * len(spans)
                self.watched_at = time.monotonic()
                self._mark_up()
                failures = 0
                self._live = True
                async with asyncio.TaskGroup() as tg:
                    tg.create_task(self._part("keepalive", self._keepalive()))
                    for i, span in enumerate(spans):
                        tg.create_task(self._part("watch", self._watch(i, span, revision + 1)))
                    tg.create_task(self._part("side jobs", self._work()))
            except* EtcdError as group:
                self.mark_down(group.exceptions[0])
            finally:
                self._live = False
            failures += 1
            await asyncio.sleep(RECONNECT.delay_s(failures, self._rng))

    async def _part(self, name: str, part: Awaitable[None]) -> None:
        """One task of the session: it lasts as long as the session, or ends it.

        The TaskGroup would drop a task that returned or was ended by a library's
        CancelledError nobody asked for (see daemon/loops.py), and the agent would
        go on with no keepalive, watch or side jobs while it reads as up.
        """
        try:
            await part
        except asyncio.CancelledError as err:
            if stop_requested():
                raise
            log.error("%s: etcd %s ended by a cancellation no one asked for", self.node, name)
            raise EtcdUnavailable(f"{name} ended by a cancellation no one asked for") from err
        raise EtcdUnavailable(f"{name} ended")

    async def _keepalive(self) -> None:
        """Refresh the lease while one is held; otherwise ask etcd only when it has been quiet."""
        while True:
            await self._due()
            sent = time.monotonic()
            lease = self.claims.lease
            if lease == 0:
                await self._check_watch()
                continue
            if sent >= self.lease_until:
                # This agent did not run for longer than the lease: whatever etcd
                # says now, every claim made under it may have gone to a peer.
                log.warning(
                    "%s: event loop stalled past the etcd lease (%.1fs late); letting it go",
                    self.node,
                    sent - self.lease_until,
                )
                self._stale_lease, self.claims.lease = lease, 0
                raise EtcdUnavailable("lease overdue: this agent stalled past its TTL")
            if sent >= self._needed_until and not any(
                kv.lease == lease for kv in self.cache.values()
            ):
                # Nothing expires with it any more: a follower holds no lease.
                self._stale_lease, self.claims.lease = lease, 0
                await self.etcd.revoke(lease)
                self._stale_lease = 0
                continue
            ttl = await self.etcd.keepalive(lease)
            if ttl <= 0:
                # Expired (etcd was away longer than the TTL, or lost its data).
                log.warning("%s: etcd lease expired, and what it held", self.node)
                self.claims.lease = 0
                raise EtcdUnavailable("lease expired")
            self.lease_until, self._renewed_at = sent + ttl, sent
            self._mark_up()

    async def _due(self) -> None:
        """Until the lease is due a refresh (a third of its TTL), or etcd has been quiet."""
        while not self._probe:
            if self.claims.lease:
                due = self._renewed_at + self.lease_ttl_s / 3
            else:
                due = self.heard_at + self.quiet_s
            wait = due - time.monotonic()
            if wait <= 0:
                break
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._wake.wait()
            self._wake.clear()
        self._probe = False

    async def _check_watch(self) -> None:
        """One question when etcd was quiet: is it there, and has the watch missed anything?"""
        changed = [
            {
                "request_range": {
                    "key": b64(start),
                    "range_end": b64(end),
                    # Keys only: etcd filters the keys it returns by min_mod_revision,
                    # not the count it gives (count_only would count them all).
                    "keys_only": True,
                    "min_mod_revision": str(seen + 1),
                }
            }
            for (start, end), seen in zip(self.spans(), self._watched, strict=False)
        ]
        _, responses = await self.etcd.txn([], changed)
        missed = sum(len(kvs) for kvs in ranges(responses))
        if missed and time.monotonic() - self.watched_at >= self.quiet_s:
            # Changes, and no event for as long: the watch is stuck. (Events that
            # are on their way to a busy agent are not missed: it still hears them.)
            raise EtcdUnavailable(f"a watch missed {missed} change(s); reading afresh")
        self._mark_up()

    def spans(self) -> list[tuple[str, str]]:
        """The ``[start, end)`` key spans mirrored: the prefix, but only this rack's evidence.

        Every rack leader's publications reach its own rack's watchers, not the
        whole fleet's: at 40 a rack, a put is 40 watch events, not 1,000.
        """
        ev = self.prefix + "evidence/"
        out = [(self.prefix, ev), (ev[:-1] + "0", self.prefix[:-1] + "0")]
        if self.rack:
            out.append((f"{ev}{self.rack}/", f"{ev}{self.rack}0"))
        return out

    async def _watch(self, i: int, span: tuple[str, str], revision: int) -> None:
        async for ev in self.etcd.watch(span[0], revision, end=span[1]):
            if ev.kind == "DELETE":
                self.cache.pop(ev.kv.key, None)
                self.seen_at.pop(ev.kv.key, None)
                self.put_at.pop(ev.kv.key, None)
            else:
                now = time.monotonic()
                self.cache[ev.kv.key] = ev.kv
                self.seen_at.setdefault(ev.kv.key, now)
                self.put_at[ev.kv.key] = now
            self._watched[i] = max(self._watched[i], ev.kv.mod_revision)
            self.heard_at = self.watched_at = time.monotonic()
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
                async with time_limit(1.0):
                    await self.etcd.revoke(self.claims.lease)
        await self.etcd.close()
