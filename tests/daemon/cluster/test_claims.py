"""Atomic claims against a real etcd: budgets never exceeded, slots die with their agent."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from daemon.cluster.claims import Budgets, Claims
from daemon.cluster.etcd import EtcdClient, EtcdError
from fakes.etcd_server import EtcdServer
from tests.support.wait import wait_for_result

Factory = Callable[[str, int], Awaitable[Claims]]


def budgets(cluster: int = 3, rack: int = 1, storm: int = 50, resumes: int = 1) -> Budgets:
    return Budgets(cluster, rack, storm, 600.0, resumes, 2.0)


@pytest.fixture
async def agents(etcd_server: EtcdServer, prefix: str) -> AsyncIterator[Factory]:
    """Make agents: each its own client and lease, as separate processes would have."""
    made: list[EtcdClient] = []

    async def make(node: str, ttl: int = 30) -> Claims:
        client = EtcdClient([etcd_server.url], timeout_s=5.0)
        made.append(client)
        c = Claims(client, node, prefix)
        c.lease = await client.grant(ttl)
        return c

    yield make
    for client in made:
        await client.close()


async def holders(c: Claims, under: str) -> list[str]:
    kvs, _ = await c.etcd.get_prefix(c.key(under))
    return sorted(kv.value.decode() for kv in kvs)


async def test_twenty_agents_racing_for_three_slots_get_exactly_three(agents: Factory) -> None:
    claims = [await agents(f"gpu{i:02d}", 30) for i in range(20)]
    b = budgets(cluster=3)
    grants = await asyncio.gather(
        *(c.claim_drain(f"rack{i % 4}", True, b) for i, c in enumerate(claims))
    )
    won = [c.node for c, g in zip(claims, grants, strict=True) if g.granted]
    assert len(won) == 3
    assert await holders(claims[0], "drain/cluster/") == sorted(won)
    refused = [g.why for g in grants if not g.granted]
    assert all("cluster budget exhausted (3/3 claimed)" in w for w in refused), refused
    again = await claims[claims.index(next(c for c in claims if c.node == won[0]))].claim_drain(
        "rack0", True, b
    )
    assert again.granted  # a holder asking again keeps its slot, takes no second one
    assert len(await holders(claims[0], "drain/cluster/")) == 3


async def test_node_causes_also_count_against_the_rack(agents: Factory) -> None:
    a1, a2, b1 = await agents("a1", 30), await agents("a2", 30), await agents("b1", 30)
    b = budgets(cluster=5, rack=1)
    assert (await a1.claim_drain("a", False, b)).granted
    refused = await a2.claim_drain("a", False, b)
    assert not refused.granted and "rack budget exhausted (1/1 claimed in a)" in refused.why
    assert (await a2.claim_drain("a", True, b)).granted  # a rack-wide cause takes the rack
    assert (await b1.claim_drain("b", False, b)).granted


async def test_a_dead_agents_slot_expires_with_its_lease(agents: Factory) -> None:
    dead, alive = await agents("dead", 2), await agents("alive", 30)
    b = budgets(cluster=1)
    assert (await dead.claim_drain("a", True, b)).granted
    assert not (await alive.claim_drain("a", True, b)).granted
    # No keepalive for the dead agent: its slot goes within the TTL.
    grant = await wait_for_result(
        lambda: alive.claim_drain("a", True, b), lambda g: g.granted, timeout=10.0, interval=0.25
    )
    assert grant.granted and await holders(alive, "drain/cluster/") == ["alive"]


async def test_the_storm_breaker_opens_for_all_and_holds_until_reset(agents: Factory) -> None:
    claims = [await agents(f"n{i}", 30) for i in range(6)]
    b = budgets(cluster=10, storm=2)  # open above 2 trips
    results = [await c.claim_drain("r", True, b) for c in claims[:3]]
    assert all(g.granted for g in results)
    opened = await claims[3].claim_drain("r", True, b)
    assert not opened.granted and "storm breaker opened (3 trips" in opened.why
    held = await claims[4].claim_drain("r", True, b)
    assert not held.granted and "storm breaker open fleet-wide (3 trips, opened by n3)" in held.why
    await claims[5].reset_breaker()
    assert (await claims[4].claim_drain("r", True, b)).granted


async def test_resumes_are_staggered_per_rack_window(agents: Factory) -> None:
    a1, a2, b1 = await agents("a1", 30), await agents("a2", 30), await agents("b1", 30)
    b = budgets(cluster=5, resumes=1)  # one resume per rack per 2 s window
    for c, rack in ((a1, "a"), (a2, "a"), (b1, "b")):
        assert (await c.claim_drain(rack, True, b)).granted
        await c.put_cause(rack, "cooling_loop")
    assert (await a1.claim_resume("a", b)).granted
    assert await holders(a1, "drain/cluster/") == ["a2", "b1"]  # a1's slot went with it
    causes, _ = await a1.etcd.get_prefix(a1.key("cause/"))
    assert sorted(kv.key.rsplit("/", 1)[1] for kv in causes) == ["a2", "b1"]
    refused = await a2.claim_resume("a", b)
    assert not refused.granted and refused.why.startswith("staggered fleet-wide: 1 resume(s) in a")
    assert (await b1.claim_resume("b", b)).granted  # another rack has its own window
    grant = await wait_for_result(
        lambda: a2.claim_resume("a", b), lambda g: g.granted, timeout=10.0, interval=0.25
    )
    assert grant.granted


async def test_without_a_lease_nothing_is_claimed_that_would_outlive_the_agent(
    agents: Factory,
) -> None:
    c = await agents("gpu01", 30)
    c.lease = 0  # between leases (expired, or given up after a stall)
    for claim in (c.claim_drain("rack0", False, budgets()), c.put_cause("rack0", "rack")):
        with pytest.raises(EtcdError, match="no etcd lease"):
            await claim
    kvs, _ = await c.etcd.get_prefix(c.p)
    assert kvs == []
    # A resume slot expires with its stagger window, not with the agent: no agent lease needed.
    assert (await c.claim_resume("rack0", budgets())).granted
    kvs, _ = await c.etcd.get_prefix(c.p)
    assert [(kv.key, kv.lease != 0) for kv in kvs] == [(c.p + "resume/rack0/0", True)]
