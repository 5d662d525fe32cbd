"""Leases on demand: an agent holds one only while something must expire with it.

A follower that merely watches sends etcd nothing at steady state; a claim, a
cause or a leadership takes a lease, which is kept alive while it is held and
given back after. A holder that dies still loses what it held within a TTL.
All against a real etcd.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from daemon.cluster.agent import EtcdAgent
from daemon.cluster.claims import Budgets, Claims
from daemon.cluster.etcd import EtcdClient
from fakes.etcd_server import EtcdServer
from policies.model import Action, FaultDomain
from tests.daemon.cluster.test_fleet import fleet_agent, local, outcome
from tests.daemon.cluster.test_leader import TTL_S, rack
from tests.support.wait import wait_for_result, wait_until

TTL = 2


async def test_a_watcher_holds_no_lease_a_claim_takes_one_and_gives_it_back_after(
    etcd_server: EtcdServer, prefix: str
) -> None:
    async with (
        fleet_agent(etcd_server.url, "a1", "a", prefix, TTL) as a1,
        fleet_agent(etcd_server.url, "a2", "a", prefix, TTL) as a2,
    ):
        one, two = a1.etcd, a2.etcd
        assert one is not None and two is not None
        assert (one.claims.lease, two.claims.lease, one.grants, two.grants) == (0, 0, 0, 0)
        assert await a1.admit(outcome("a1", Action.DRAIN, FaultDomain.GPU)) == ""
        held = one.claims.lease
        assert held != 0 and one.grants == 1
        await wait_until(lambda: two.get("drain", "cluster", "0") is not None, what="slot seen")
        slot = two.get("drain", "cluster", "0")
        assert slot is not None and slot.lease == held
        # Held for several TTLs: kept alive, the slot stays; the watcher still holds none.
        await asyncio.sleep(3 * TTL)
        kvs, _ = await two.etcd.get_prefix(prefix + "drain/cluster/")
        assert [kv.value for kv in kvs] == [b"a1"]
        assert one.claims.lease == held and one.up and two.claims.lease == 0 and two.up
        assert "a1" in a2.view(local("a2"), time.monotonic()).out  # counted by the watcher
        # The resume frees the slot: nothing is bound to the lease; it goes within a TTL or so.
        assert await a1.admit(outcome("a1", Action.RESUME, FaultDomain.GPU)) == ""
        freed = time.monotonic()
        await wait_until(lambda: one.claims.lease == 0, timeout=3 * TTL, what="lease given back")
        assert time.monotonic() - freed <= TTL + TTL / 3 + 1.0
        # Revoked (it may be on its way), not left to expire: well within its 2 s TTL.
        await wait_for_result(
            lambda: two.etcd.call("/v3/lease/timetolive", {"ID": str(held)}),
            lambda alive: int(alive.get("TTL", 0)) <= 0,
            timeout=1.0,
            what="the lease revoked",
        )
        assert one.up and two.up and one.grants == 1


async def test_an_agent_that_dies_holding_a_claim_loses_it_within_a_ttl(
    etcd_server: EtcdServer, prefix: str
) -> None:
    agent = EtcdAgent(
        EtcdClient([etcd_server.url], timeout_s=0.5), "d1", prefix=prefix, lease_ttl_s=TTL
    )
    task = asyncio.create_task(agent.run())
    await wait_until(lambda: agent.up, what="joined")
    b = Budgets(1, 1, 50, 600.0, 1, 60.0)
    assert (await agent.claims.claim_drain("a", True, b, "cooling_loop")).granted
    # Killed: no revoke, no more keepalives.
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    died = time.monotonic()
    peer = Claims(EtcdClient([etcd_server.url], timeout_s=2.0), "p1", prefix)
    peer.lease = await peer.etcd.grant(30)
    assert not (await peer.claim_drain("b", True, b)).granted
    while not (await peer.claim_drain("b", True, b)).granted:
        assert time.monotonic() - died < TTL + 2.0, "the dead agent's slot outlived its lease"
        await asyncio.sleep(0.1)
    kvs, _ = await peer.etcd.get_prefix(prefix + "cause/")
    assert kvs == []  # its rack-wide cause went with it
    await peer.etcd.revoke(peer.lease)
    await peer.etcd.close()
    await agent.etcd.close()


async def test_a_rack_has_one_leader_only_it_holds_a_lease_and_only_the_rack_sees_its_evidence(
    etcd_server: EtcdServer, prefix: str
) -> None:
    stranger = EtcdClient([etcd_server.url], timeout_s=2.0)
    async with rack(etcd_server.url, prefix, ("a1", "a2", "a3", "a4", "a5")) as members:
        await wait_until(
            lambda: sum(m.leader.leading for m in members) == 1, timeout=10, what="one leader"
        )
        lead = next(m for m in members if m.leader.leading)
        # The election's losers give back the leases they took to stand.
        await wait_until(
            lambda: [m.agent.claims.lease != 0 for m in members] == [m is lead for m in members],
            timeout=4 * TTL_S,
            what="only the leader holding a lease",
        )
        assert sum(m.agent.grants for m in members) <= len(members)
        await stranger.put(prefix + "evidence/b/pdu", b"another rack's")
        await stranger.put(prefix + "breaker-probe", b"x")  # after it, in the same watch
        follower = next(m for m in members if m is not lead)
        await wait_until(
            lambda: follower.agent.get("breaker-probe") is not None, what="the probe key seen"
        )
        assert follower.agent.get("evidence", "b", "pdu") is None
        # Its own rack's evidence comes on a watch of its own (EtcdAgent.spans), not in
        # order with the probe's: under load it may arrive a moment after it.
        await wait_until(
            lambda: follower.agent.get("evidence", "a", "pdu") is not None,
            what="its own rack's evidence",
        )
    await stranger.close()


async def test_thirty_agents_finding_the_view_unled_stand_a_few_at_a_time_not_all_at_once(
    etcd_server: EtcdServer, prefix: str
) -> None:
    agents = [
        EtcdAgent(EtcdClient([etcd_server.url], timeout_s=2.0), f"v{i:02d}", prefix=prefix)
        for i in range(30)
    ]
    tasks = [asyncio.create_task(a.run()) for a in agents]
    try:
        await wait_until(lambda: all(a.up for a in agents), what="all joined")

        async def elect(a: EtcdAgent) -> None:
            while a.get("viewer") is None or not any(x.holds(x.get("viewer")) for x in agents):
                await a.stand("viewer", candidates=len(agents))
                await asyncio.sleep(0.05)

        await asyncio.wait_for(asyncio.gather(*(elect(a) for a in agents)), timeout=15)
        # All saw it free at once; each was due at its own time within TTL/3, and the
        # first key reached the rest before most were: a few grants, not thirty.
        standing = sum(a.grants for a in agents)
        assert 1 <= standing <= 10, standing
        assert sum(a.holds(a.get("viewer")) for a in agents) == 1
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(a.close() for a in agents))


class FreezingProxy:
    """A TCP proxy to etcd that can go silent on every connection open now (new ones pass)."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.removeprefix("http://").rsplit(":", 1)
        self.upstream = (host, int(port))
        self.frozen = False
        self._generation = 0
        self._writers: list[asyncio.StreamWriter] = []
        self._tasks: list[asyncio.Task[object]] = []
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def freeze_open_connections(self) -> None:
        self._generation += 1

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        born = self._generation
        task = asyncio.current_task()
        assert task is not None
        self._tasks.append(task)
        up_r, up_w = await asyncio.open_connection(*self.upstream)
        self._writers += [writer, up_w]

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            while data := await src.read(65536):
                if self._generation != born:
                    return  # silent from now on: nothing more passes, nothing is closed
                dst.write(data)
                await dst.drain()

        await asyncio.gather(pipe(reader, up_w), pipe(up_r, writer), return_exceptions=True)
        await asyncio.Event().wait()  # hold the connections open, silent

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for w in self._writers:
            w.close()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


async def test_etcd_recovers_a_watcher_whose_watch_went_silent_while_etcd_answers(
    etcd_server: EtcdServer, prefix: str
) -> None:
    proxy = FreezingProxy(etcd_server.url)
    url = await proxy.start()
    agent = EtcdAgent(EtcdClient([url], timeout_s=0.5), "w1", prefix=prefix, lease_ttl_s=TTL)
    task = asyncio.create_task(agent.run())
    writer = EtcdClient([etcd_server.url], timeout_s=2.0)
    try:
        await wait_until(lambda: agent.up, what="joined")
        proxy.freeze_open_connections()  # its watches (and pooled connections) go silent
        await writer.put(prefix + "cause/a/x1", b'{"domain": "rack"}')
        silent = time.monotonic()
        # Nothing arrives; after quiet_s it asks (on a new connection, or times out on
        # a silent one), reads afresh and watches again: the cause is seen.
        await wait_until(
            lambda: agent.get("cause", "a", "x1") is not None,
            timeout=agent.quiet_s + 8,
            what="the change its silent watch never brought",
        )
        assert time.monotonic() - silent <= agent.quiet_s + 6
        await wait_until(lambda: agent.up, what="up again")
        assert agent.claims.lease == 0
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await agent.close()
        await writer.close()
        await proxy.close()
