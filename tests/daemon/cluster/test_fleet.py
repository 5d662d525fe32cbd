"""The fleet gate on a real etcd: the mirror, the breaker, causes, degraded mode and back."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from functools import partial
from typing import NoReturn

import orjson
import pytest
from aiohttp import web

from adapters.sensors.nvml import NvmlAdapter
from daemon.cluster.agent import EtcdAgent
from daemon.cluster.etcd import EtcdClient
from daemon.cluster.fleet import Fleet
from daemon.service.engine import PolicyEngine
from daemon.service.state import StateStore
from fakes.etcd_server import EtcdServer
from fakes.gpus import H100_SXM
from fakes.nvml import fake_node
from policies.model import (
    REASON_PREFIX,
    Action,
    Assessment,
    Condition,
    Decision,
    FaultDomain,
    idempotency_key,
)
from policies.policy import NodeView, Outcome
from policies.power_cap import CapLadder, CapSettings, CapState
from policies.rules import NodeState
from policies.safety import BreakerState, ClusterView
from policies.settings import PolicySettings
from tests.support.stray_cancel import reply_racing_the_cancel
from tests.support.wait import wait_until

SETTINGS = PolicySettings(cluster_budget_nodes=1, cluster_budget_pct=0.0)


def outcome(node: str, action: Action, domain: FaultDomain, *, critical: bool = False) -> Outcome:
    d = Decision(
        node, action, f"{REASON_PREFIX} test", domain, 0.0, idempotency_key(node, action, 1)
    )
    a = Assessment(node, domain, Condition.WARNING, 0.0)
    return Outcome(NodeState(), NodeView.given(a), (), None, d, critical=critical)


@contextlib.asynccontextmanager
async def fleet_agent(
    url: str, node: str, rack: str, prefix: str, ttl: int = 3, client: EtcdClient | None = None
) -> AsyncIterator[Fleet]:
    """An agent and its fleet gate, as the daemon builds them (claims time out at 0.5 s)."""
    client = client or EtcdClient([url], timeout_s=0.5)
    agent = EtcdAgent(client, node, prefix=prefix, lease_ttl_s=ttl)
    fleet = Fleet(node, rack, lambda: SETTINGS, etcd=agent, claim_timeout_s=0.5)
    task = asyncio.create_task(agent.run())
    try:
        await wait_until(lambda: agent.up, timeout=10, what=f"{node} joined etcd")
        yield fleet
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await agent.close()


@contextlib.asynccontextmanager
async def two_racks(url: str, prefix: str) -> AsyncIterator[tuple[Fleet, Fleet]]:
    """Agents a1 (rack a) and b1 (rack b), on leases that outlive a test."""
    async with (
        fleet_agent(url, "a1", "a", prefix, ttl=30) as one,
        fleet_agent(url, "b1", "b", prefix, ttl=30) as two,
    ):
        yield one, two


def local(node: str) -> ClusterView:
    return ClusterView({"a": (node,)})


async def test_a_rack_wide_drain_is_seen_by_the_rack_at_once(
    etcd_server: EtcdServer, prefix: str
) -> None:
    async with (
        fleet_agent(etcd_server.url, "a1", "a", prefix) as lead,
        fleet_agent(etcd_server.url, "a2", "a", prefix) as peer,
    ):
        assert await lead.admit(outcome("a1", Action.DRAIN, FaultDomain.COOLING_LOOP)) == ""
        await wait_until(
            lambda: "a1" in peer.view(local("a2"), time.monotonic()).out,
            what="the peer's cause mirrored",
        )
        seen = peer.view(local("a2"), time.monotonic()).out["a1"]
        assert (seen.rack, seen.domain, seen.following) == ("a", FaultDomain.COOLING_LOOP, "")
        # The cluster budget (1) is taken: the peer's own predictive drain is refused.
        why = await peer.admit(outcome("a2", Action.DRAIN, FaultDomain.GPU))
        assert why.startswith("drain withheld: cluster budget exhausted (1/1"), why
        # A critical exclusion never waits for a claim.
        assert await peer.admit(outcome("a2", Action.EXCLUDE, FaultDomain.GPU, critical=True)) == ""
        # The lead resumes: its slot and cause go, and the peer sees that too.
        assert await lead.admit(outcome("a1", Action.RESUME, FaultDomain.NONE)) == ""
        await wait_until(
            lambda: "a1" not in peer.view(local("a2"), time.monotonic()).out,
            what="the cause gone from the peer's view",
        )
        assert peer.claims_refused == 1 and lead.claims_granted == 2


async def reply_racing_the_time_limit(*args: object) -> NoReturn:
    """A call whose reply lands as its time limit cancels it: a client library's own kind."""
    await reply_racing_the_cancel()
    raise AssertionError("not cancelled")


async def test_a_claim_whose_reply_races_its_time_limit_goes_ahead_degraded(
    etcd_server: EtcdServer, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with fleet_agent(etcd_server.url, "a1", "a", prefix) as gate:
        agent = gate.etcd
        assert agent is not None

        monkeypatch.setattr(agent.claims, "claim_drain", reply_racing_the_time_limit)
        # Before: the library's CancelledError went up through the policy's evaluation.
        assert await gate.admit(outcome("a1", Action.DRAIN, FaultDomain.GPU)) == ""
        assert agent.failures == 1 and not agent.up


async def test_a_goodbye_whose_reply_races_its_time_limit_still_closes(
    etcd_server: EtcdServer, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A TTL the test never reaches: the agent's own keepalive never gives the lease back.
    async with fleet_agent(etcd_server.url, "a1", "a", prefix, ttl=60) as gate:
        agent = gate.etcd
        assert agent is not None
        await agent.hold_lease()
        assert agent.up  # so close() revokes
        monkeypatch.setattr(agent.etcd, "revoke", reply_racing_the_time_limit)
        # Before: the library's CancelledError left close() (and the daemon's stop) there.
        await agent.close()
        assert agent.etcd._session is None  # the HTTP session closed all the same


async def test_the_breaker_is_fleet_wide_and_one_reset_closes_it(
    etcd_server: EtcdServer, prefix: str
) -> None:
    async with (
        fleet_agent(etcd_server.url, "a1", "a", prefix) as one,
        fleet_agent(etcd_server.url, "b1", "b", prefix) as two,
    ):
        assert one.etcd is not None
        await one.etcd.claims.open_breaker(9)
        await wait_until(lambda: two.breaker(BreakerState(), time.monotonic()).open, what="open")
        assert two.breaker(BreakerState(), time.monotonic()).trips == 9
        why = await two.admit(outcome("b1", Action.DRAIN, FaultDomain.GPU))
        assert "storm breaker open fleet-wide (9 trips, opened by a1)" in why
        one.reset_storm()  # what POST /v1/overrides reset_storm does on one agent
        opened = BreakerState(1.0, 9)
        await wait_until(lambda: not two.breaker(opened, time.monotonic()).open, what="closed")


async def test_etcd_away_degrades_without_blocking_and_recovers(prefix: str) -> None:
    server = EtcdServer()
    server.start()
    try:
        async with fleet_agent(server.url, "a1", "a", prefix) as fleet:
            assert fleet.etcd is not None and not fleet.degraded
            server.stop()
            # The next claim finds it away: the drain goes ahead on the scheduler view.
            started = time.monotonic()
            assert await fleet.admit(outcome("a1", Action.DRAIN, FaultDomain.GPU)) == ""
            assert time.monotonic() - started < 5.0  # bounded by the claim timeout, no hang
            await wait_until(lambda: fleet.degraded, timeout=10, what="degraded")
            assert fleet.status().degraded is True and fleet.etcd.failures >= 1
            assert (
                await fleet.admit(outcome("a1", Action.EXCLUDE, FaultDomain.GPU, critical=True))
                == ""
            )
            server.start()
            await wait_until(lambda: not fleet.degraded, timeout=15, what="recovered")
            assert await fleet.admit(outcome("a1", Action.DRAIN, FaultDomain.GPU)) == ""
    finally:
        server.close()


@pytest.mark.parametrize("refuse", ["drain withheld: cluster budget exhausted", ""])
async def test_a_refused_claim_leaves_the_policy_as_if_nothing_was_decided(refuse: str) -> None:
    class Gate:
        asked = 0

        def breaker(self, current: BreakerState, now: float) -> BreakerState:
            return current

        async def admit(self, o: Outcome) -> str:
            Gate.asked += 1
            return refuse

    nvml = fake_node(H100_SXM, count=2)
    for g in nvml.gpus:
        g.temperature_c = 88.0  # within the enter margin of slowdown: a drain
    store = StateStore()
    adapter = NvmlAdapter("gpus", nvml)
    await adapter.connect()
    store.update("gpus", await adapter.read())
    await adapter.close()
    decided: list[Decision] = []
    engine = PolicyEngine("n1", PolicySettings(min_dwell_s=0.0), store, decided.append)
    engine.gate = Gate()
    out = await engine.step(time.monotonic(), time.time())
    assert Gate.asked == 1
    if refuse:
        assert out.decision is None and out.note == refuse and not decided
        assert engine.state.action is Action.RESUME  # rolled back: asked again next time
    else:
        assert out.decision is not None and decided and engine.state.action is Action.DRAIN


@pytest.mark.parametrize(
    "answer",
    [
        b'{"header": {"revision": "x"}}',  # not a number
        b'{"kvs": [{"key": "%%%not-base64"}], "header": {}}',
        b'{"responses": "nope", "succeeded": true}',
        b"<html>proxy error</html>",
        b'{"ID": null}',
    ],
)
async def test_a_hostile_gateway_degrades_the_agent_never_crashes_it(answer: bytes) -> None:
    async def junk(request: web.Request) -> web.Response:
        return web.Response(body=answer, content_type="application/json")

    app = web.Application()
    app.router.add_post("/{tail:.*}", junk)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    agent = EtcdAgent(EtcdClient([url], timeout_s=0.5), "a1", lease_ttl_s=3)
    fleet = Fleet("a1", "a", lambda: SETTINGS, etcd=agent, claim_timeout_s=0.5)
    task = asyncio.create_task(agent.run())
    try:
        await wait_until(lambda: agent.failures >= 1, timeout=10, what="found unusable")
        assert not task.done() and fleet.degraded
        # Even when it once looked fine (answering, a lease promised), a claim on junk falls back.
        agent.up, agent.claims.lease, agent.lease_until = True, 1, time.monotonic() + 60
        assert not fleet.degraded
        assert await fleet.admit(outcome("a1", Action.DRAIN, FaultDomain.GPU)) == ""
        assert fleet.degraded
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await agent.close()
        await runner.cleanup()


async def test_power_cap_watts_shared_through_the_fleet_count_against_the_budget(
    etcd_server: EtcdServer, prefix: str
) -> None:
    async with two_racks(etcd_server.url, prefix) as (one, two):
        assert one.etcd is not None and two.etcd is not None
        one.caps = CapLadder(CapSettings(budget_w=500.0))
        one.caps.restore(CapState("a1", "0", 300.0, 700.0, 0.0, "margin"))  # 400 W given up
        two.caps = CapLadder(CapSettings(budget_w=500.0))

        def seen_by_two() -> float:
            one.view(local("a1"), time.monotonic())  # each evaluation publishes its own
            return two.view(local("b1"), time.monotonic()).capped_w

        await wait_until(lambda: seen_by_two() == 400.0, what="a1's capped watts at b1")
        assert one.view(local("a1"), time.monotonic()).capped_w == 0.0  # its own not counted
        # b1's ladder, given that view: a 200 W cap would pass the 500 W cluster budget.
        two.caps._others_w = seen_by_two()
        assert two.caps._withheld("b1", None, 200.0) == "cap budget of 500W reached"
        assert two.caps._withheld("b1", None, 50.0) == ""
        # a1 newly capped counted once toward the cap storm.
        await wait_until(
            lambda: one.etcd is not None and one.etcd.get("trip", "cap", "a1") is not None,
            what="a1's cap trip",
        )
        # Restored: a1's watts leave the budget.
        one.caps.states.clear()
        await wait_until(lambda: seen_by_two() == 0.0, what="a1's caps gone at b1")
        # A hostile value (another tenant's write, a peer's bug) counts nothing.
        for junk in (b'{"watts": -5}', b"not json", b'{"watts": "many"}'):
            await two.etcd.etcd.put(two.etcd.claims.key("caps", "x9"), junk)
            await wait_until(partial(_is_mirrored, two, "x9", junk), what="junk mirrored")
            assert seen_by_two() == 0.0
        assert two.etcd.values.bad["caps"] >= 3


async def test_power_cap_ladder_withholds_new_caps_while_the_breaker_is_open() -> None:
    ladder = CapLadder(CapSettings())
    ladder._breaker_open = True
    assert ladder._withheld("n1", None, 100.0) == "storm breaker open"


def _is_mirrored(fleet: Fleet, node: str, value: bytes) -> bool:
    kv = fleet.etcd.get("caps", node) if fleet.etcd is not None else None
    return kv is not None and kv.value == value


async def test_power_cap_storm_opens_the_fleet_breaker_above_storm_nodes(
    etcd_server: EtcdServer, prefix: str
) -> None:
    async with two_racks(etcd_server.url, prefix) as (one, two):
        assert one.etcd is not None and two.etcd is not None
        claims = (one.etcd.claims, two.etcd.claims)
        await claims[0].record_cap(storm_nodes=1, window_s=600.0)
        await claims[0].record_cap(storm_nodes=1, window_s=600.0)  # one node counts once
        assert await _values(one, "trip/cap/") == [b"a1"]
        assert await _values(one, "breaker") == []
        await claims[1].record_cap(storm_nodes=1, window_s=600.0)  # a second node: a storm
        assert [orjson.loads(v) for v in await _values(one, "breaker")] == [
            {"trips": 2, "by": "b1"}
        ]
        # Open for drains too; the cap trips are not drain trip slots.
        why = await one.admit(outcome("a1", Action.DRAIN, FaultDomain.GPU))
        assert "storm breaker open fleet-wide (2 trips, opened by b1)" in why
        await claims[1].reset_breaker()  # an operator's reset clears the cap trips as well
        assert await _values(one, "trip/cap/") == []
        await claims[0].put_caps(400.0)
        assert [orjson.loads(v) for v in await _values(one, "caps/")] == [{"watts": 400.0}]
        await claims[0].put_caps(0.0)
        assert await _values(one, "caps/") == []


async def _values(fleet: Fleet, under: str) -> list[bytes]:
    assert fleet.etcd is not None
    kvs, _ = await fleet.etcd.claims.etcd.get_prefix(fleet.etcd.claims.key(under))
    return sorted(kv.value for kv in kvs)
