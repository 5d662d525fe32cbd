"""A real etcd that stalls (SIGSTOP), restarts, loses its data or holds garbage: the fleet lives.

Each test has its own etcd member (they stop, wipe and freeze it); the agents
are the daemon's own EtcdAgent and Fleet, the etcd is the real server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from pathlib import Path

import orjson
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from daemon.cluster.agent import EtcdAgent
from daemon.cluster.claims import Budgets, Claims, Grant
from daemon.cluster.etcd import EtcdClient
from daemon.cluster.fleet import Fleet
from daemon.service.cluster import FleetCollector
from fakes.etcd_server import EtcdServer
from policies.model import Action, FaultDomain
from policies.safety import ClusterView
from tests.daemon.cluster.test_fleet import fleet_agent, outcome
from tests.daemon.cluster.test_leader import TTL_S, Member, rack
from tests.support.stray_cancel import CancelledWithResult
from tests.support.wait import wait_until

PREFIX = "/rg/"
BUDGET = Budgets(1, 1, 50, 600.0, 1, 2.0)


def member(url: str, node: str, ttl: int = 30) -> contextlib.AbstractAsyncContextManager[Fleet]:
    """An agent and its fleet gate, as the daemon builds them."""
    return fleet_agent(url, node, "a", PREFIX, ttl)


def agent_of(fleet: Fleet) -> EtcdAgent:
    assert fleet.etcd is not None
    return fleet.etcd


async def holder(url: str, node: str) -> Claims:
    """Another node holding the cluster's only drain slot, under a lease of its own."""
    client = EtcdClient([url], timeout_s=2.0)
    c = Claims(client, node, PREFIX)
    c.lease = await client.grant(60)
    assert (await c.claim_drain("b", True, BUDGET)).granted
    return c


def freeze(pid: int) -> None:
    """SIGSTOP, and wait until every thread of the process has stopped."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 5.0
    tasks = Path(f"/proc/{pid}/task")
    while not all(_state(t) in "Tt" for t in tasks.iterdir()):
        assert time.monotonic() < deadline, "etcd did not stop"
        time.sleep(0.01)


def _state(task: Path) -> str:
    stat = (task / "stat").read_text()
    return stat[stat.rindex(")") + 2]


async def test_etcd_recovers_from_a_stall_the_agent_is_up_again_and_the_budget_holds(
    etcd: EtcdServer,
) -> None:
    other = await holder(etcd.url, "b1")
    drain = outcome("a1", Action.DRAIN, FaultDomain.GPU)
    # A long lease: keepalives are 10 s apart, so nothing but the claim meets the stall.
    async with member(etcd.url, "a1", ttl=30) as fleet:
        agent = agent_of(fleet)
        assert await fleet.admit(drain) == "drain withheld: cluster budget exhausted (1/1 claimed)"
        assert etcd.proc is not None
        freeze(etcd.proc.pid)
        try:
            assert await fleet.admit(drain) == ""  # timed out: degraded, as designed
            assert not agent.up and fleet.degraded
            await asyncio.sleep(2.5)
        finally:
            os.kill(etcd.proc.pid, signal.SIGCONT)
        resumed = time.monotonic()
        await wait_until(lambda: agent.up, timeout=10, what="up again after the stall")
        back_in = time.monotonic() - resumed
        assert back_in < 3.0, back_in  # the reconnect's backoff, not a restart
        assert not fleet.degraded
        # Up again means claims again: the slot b1 holds is not overshot.
        assert await fleet.admit(drain) == "drain withheld: cluster budget exhausted (1/1 claimed)"
        assert fleet.claims_refused == 2
    await other.etcd.close()


async def test_etcd_recovers_from_a_restart_and_from_a_wiped_data_dir(etcd: EtcdServer) -> None:
    drain = outcome("a1", Action.DRAIN, FaultDomain.GPU)
    async with member(etcd.url, "a1", ttl=5) as fleet:
        agent = agent_of(fleet)
        assert agent.claims.lease == 0  # it holds nothing: it watches without a lease
        etcd.stop()
        await wait_until(lambda: not agent.up, timeout=10, what="degraded while etcd is down")
        etcd.start()
        await wait_until(lambda: agent.up, timeout=15, what="up after the restart")
        assert await fleet.admit(drain) == ""
        assert fleet.claims_granted == 1
        held = agent.claims.lease
        assert held != 0  # the slot is bound to a lease taken for it
        etcd.stop()
        await wait_until(lambda: not agent.up, timeout=10, what="degraded again")
        etcd.start()
        await wait_until(lambda: agent.up, timeout=15, what="up after the second restart")
        assert agent.claims.lease == held  # etcd kept its data: the same lease lives on
        assert agent.get("drain", "cluster", "0") is not None
        # The member comes back empty: no lease, no slot, revision 1.
        etcd.stop()
        await wait_until(lambda: not agent.up, timeout=10, what="degraded before the wipe")
        etcd.wipe()
        etcd.start()
        await wait_until(
            lambda: agent.up and agent.claims.lease != held,
            timeout=15,
            what="up on the wiped etcd, the lost lease let go",
        )
        assert agent.get("drain", "cluster", "0") is None  # the mirror was read afresh
        # Its slot went with the data: it claims again, once, and another node cannot.
        assert await fleet.admit(drain) == ""
        assert fleet.claims_granted == 2
        kvs, _ = await agent.etcd.get_prefix(PREFIX + "drain/cluster/")
        assert [kv.value for kv in kvs] == [b"a1"]
        other = await peer_claim(etcd.url)
        assert other == Grant(False, "cluster budget exhausted (1/1 claimed)")


async def peer_claim(url: str) -> Grant:
    """Another node, b1, asks for a drain slot."""
    client = EtcdClient([url], timeout_s=2.0)
    c = Claims(client, "b1", PREFIX)
    c.lease = await client.grant(60)
    grant = await c.claim_drain("b", True, BUDGET)
    await client.close()
    return grant


async def test_etcd_recovers_from_an_event_loop_stalled_past_the_lease(etcd: EtcdServer) -> None:
    async with member(etcd.url, "a1", ttl=2) as fleet:
        agent = agent_of(fleet)
        assert await fleet.admit(outcome("a1", Action.DRAIN, FaultDomain.GPU)) == ""
        stale = agent.claims.lease
        time.sleep(2.5)  # noqa: ASYNC251 (the whole event loop, not one task: nothing here keeps the lease)
        # Before any task runs again, the agent already knows it holds nothing.
        assert not agent.up and fleet.degraded
        await wait_until(
            lambda: agent.up and agent.claims.lease != stale, timeout=10, what="a new lease"
        )
        # Whatever the old lease held was let go (revoked or expired): a peer can claim it.
        assert (await peer_claim(etcd.url)).granted


GARBAGE: dict[str, bytes] = {
    "drain/cluster/0": b"\xff\xfe",  # not UTF-8: crashed every resuming agent once
    "drain/rack/a/0": "\ufffd\ufffd".encode(),  # a name no node has
    "resume/b/0": b"../../etc",
    "cause/a/a9": b'{"domain": 7}',  # wrong type
    "cause/a/a8": b'{"rack": "a"}',  # an older peer's shape: the domain is missing
    "cause/a/a7": b'{"domain": "cooling_loop", "since": 1, "v": 3}',  # a newer peer's: fine
    "cause/a/a6": b'{"domain": "meteor"}',  # no such fault domain
    "cause/a/\xff": b'{"domain": "rack"}',  # the node in the key is not a name
}


async def test_etcd_garbage_is_ignored_counted_and_logged_once_never_a_node(
    etcd: EtcdServer, caplog: pytest.LogCaptureFixture
) -> None:
    client = EtcdClient([etcd.url], timeout_s=2.0)
    for key, value in GARBAGE.items():
        await client.put(PREFIX + key, value)
    await client.close()
    caplog.set_level(logging.WARNING, logger="daemon.cluster.etcd_values")
    async with member(etcd.url, "a1") as fleet:
        agent = agent_of(fleet)
        local = ClusterView(racks={"a": ("a1", "a2")}, total_nodes=4)
        for _ in range(3):  # every evaluation reads the mirror again: logged once all the same
            view = fleet.view(local, time.monotonic())
        # Only the newer peer's well-formed cause counts; no junk name is a node out.
        assert set(view.out) == {"a7"}, view.out
        assert view.out["a7"].domain is FaultDomain.COOLING_LOOP
        assert view.resumes == ()
        # Resuming reads every drain slot: the non-UTF-8 one no longer crashes it.
        resume = outcome("a1", Action.RESUME, FaultDomain.GPU)
        assert await fleet.admit(resume) == ""
        assert agent.up and fleet.claims_granted == 1
        # A drain: the junk slot is taken (its key exists), so the budget of 1 is full.
        drain = outcome("a1", Action.DRAIN, FaultDomain.GPU)
        assert await fleet.admit(drain) == "drain withheld: cluster budget exhausted (1/1 claimed)"
        bad = dict(agent.values.bad)
        assert bad == {"slot": 3, "cause": 4}, bad
        registry = CollectorRegistry()
        registry.register(FleetCollector(fleet))
        scraped = generate_latest(registry).decode()
        assert 'rackguard_etcd_bad_values_total{kind="cause"} 4.0' in scraped, scraped
        warned = [r.getMessage() for r in caplog.records]
        assert len(warned) == 7, warned
        assert any("drain/cluster/0" in w and "not UTF-8" in w for w in warned), warned


async def test_etcd_recovers_the_rack_lead_after_a_wipe(etcd: EtcdServer) -> None:
    async with rack(etcd.url, PREFIX, ("a1", "a2")) as members:
        await wait_until(
            lambda: sum(m.leader.leading for m in members) == 1, timeout=10, what="one leader"
        )
        etcd.stop()
        etcd.wipe()
        etcd.start()

        # The old lead went with its lease: someone stands again, under a new lease.
        def leads(m: Member) -> bool:
            held = m.agent.get("leader", "a")
            return m.leader.leading and held is not None and held.lease == m.agent.claims.lease

        await wait_until(
            lambda: sum(map(leads, members)) == 1 and all(m.agent.up for m in members),
            timeout=15,
            what="a leader again after the wipe, under its new lease",
        )
        lead = next(m for m in members if leads(m))
        follower = next(m for m in members if m is not lead)
        fed = len(follower.fed)
        await wait_until(lambda: len(follower.fed) > fed + 3, timeout=10, what="fed again")


async def test_etcd_garbage_forged_or_undecodable_evidence_is_never_evidence(
    etcd: EtcdServer,
) -> None:
    async with rack(etcd.url, PREFIX, ("a1", "a2")) as members:
        await wait_until(
            lambda: sum(m.leader.leading for m in members) == 1, timeout=10, what="one leader"
        )
        lead = next(m for m in members if m.leader.leading)
        follower = next(m for m in members if m is not lead)
        await wait_until(lambda: len(follower.fed) >= 3, timeout=10, what="follower fed")
        polls = follower.pdu.polls
        # The leader's publishing stops; its agent (lease, leader key) lives on: silent.
        lead.tasks[1].cancel()
        silent = time.monotonic()
        forger = EtcdClient([etcd.url], timeout_s=2.0)
        own = await forger.grant(60)
        key = PREFIX + "evidence/a/pdu"
        lease = lead.agent.claims.lease
        forged = {
            "by": lead.node,
            "lease": lease,
            "wall": time.time(),
            "readings": [
                {
                    "source": "pdu",
                    "sensor": "forged",
                    "kind": "inlet_temperature",
                    "value": 99.0,
                    "unit": "celsius",
                    "quality": "good",
                    "age": 0.0,
                    "wall": time.time(),
                }
            ],
        }
        await forger.put(key, orjson.dumps(forged), own)  # the right words, another lease
        await wait_until(
            lambda: follower.agent.values.bad["evidence"] >= 1, timeout=5, what="forgery seen"
        )
        await forger.put(key, b"\xff{not json", lease)  # under the leader's own lease: junk
        await wait_until(
            lambda: follower.agent.values.bad["evidence"] >= 2, timeout=5, what="junk seen"
        )
        # No publication it can trust: within one TTL it polls the rack source itself.
        await wait_until(
            lambda: follower.pdu.polls > polls, timeout=TTL_S + 3, what="polling a silent leader"
        )
        assert time.monotonic() - silent <= TTL_S + 1.5
        assert all(r.sensor != "forged" for r in follower.fed)
        await forger.close()


async def test_etcd_recovers_a_watcher_without_a_lease_from_a_stall(etcd: EtcdServer) -> None:
    # A follower sends etcd nothing while the watch brings news; a frozen etcd brings
    # none, so it asks after quiet_s (3 TTLs), finds no answer and says so.
    agent = EtcdAgent(EtcdClient([etcd.url], timeout_s=0.5), "w1", prefix=PREFIX, lease_ttl_s=2)
    task = asyncio.create_task(agent.run())
    try:
        await wait_until(lambda: agent.up, what="joined")
        assert agent.claims.lease == 0 and agent.quiet_s == 6.0
        assert etcd.proc is not None
        freeze(etcd.proc.pid)
        frozen = time.monotonic()
        try:
            await wait_until(lambda: not agent.up, timeout=agent.quiet_s + 3, what="noticed")
            assert time.monotonic() - frozen <= agent.quiet_s + 0.5 + 1.0
        finally:
            os.kill(etcd.proc.pid, signal.SIGCONT)
        resumed = time.monotonic()
        await wait_until(lambda: agent.up, timeout=10, what="up again after the stall")
        assert time.monotonic() - resumed < 3.0  # its next good exchange, not a TTL
        assert agent.claims.lease == 0 and agent.grants == 0  # still holding nothing
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await agent.close()


async def test_etcd_session_task_ended_by_a_library_cancellation_reconnects(
    etcd_server: EtcdServer, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with fleet_agent(etcd_server.url, "a1", "a", prefix) as fleet:
        agent = agent_of(fleet)
        ran: list[str] = []

        async def stray() -> None:
            raise CancelledWithResult()  # as a client library may, with no one cancelling

        async def later() -> None:
            ran.append("later")

        agent.submit(stray)
        # Before: the side-job task was dropped by its TaskGroup without a word, and the
        # agent read as up while no side job (trips, causes, evidence) ever ran again.
        await wait_until(lambda: agent.failures >= 1, timeout=5, what="the session ended")
        await wait_until(lambda: agent.up, timeout=5, what="reconnected")
        agent.submit(later)
        await wait_until(lambda: ran == ["later"], timeout=5, what="side jobs run again")
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors == ["a1: etcd side jobs ended by a cancellation no one asked for"]
