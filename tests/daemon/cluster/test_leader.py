"""Rack evidence shared through etcd: one agent polls the rack's sources, the others read them.

The rack source here is a counting adapter (the thing under test is the lead
and the sharing over a real etcd, not the PDU's protocol, which has its own tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import pytest

from daemon.cluster.agent import EtcdAgent
from daemon.cluster.etcd import EtcdClient
from daemon.cluster.leader import RackLeader
from daemon.config.sources import SourceTiming
from daemon.service.runner import SourceRunner
from fakes.etcd_server import EtcdServer
from policies.model import Quality, Reading, SensorKind
from tests.support.stray_cancel import CancelledWithResult
from tests.support.wait import wait_until

TTL_S = 3


class CountingPdu:
    """A rack source: one inlet temperature per poll, counting its polls."""

    def __init__(self) -> None:
        self.name = "pdu"
        self.polls = 0

    async def connect(self) -> None:
        pass

    async def read(self) -> Sequence[Reading]:
        self.polls += 1
        now = time.monotonic()
        return [
            Reading(
                "pdu",
                "inlet.top",
                SensorKind.INLET_TEMPERATURE,
                24.0 + self.polls % 3,
                "celsius",
                Quality.GOOD,
                now - 0.2,
                time.time(),
                labels={"probe": "top"},
            )
        ]

    async def close(self) -> None:
        pass


class Sink:
    """What the daemon's _on_readings does: store (here: keep) and let the leader publish."""

    def __init__(self) -> None:
        self.fed: list[Reading] = []
        self.leader: RackLeader | None = None

    def __call__(self, source: str, readings: Sequence[Reading]) -> None:
        self.fed.extend(readings)
        if self.leader is not None:
            self.leader.on_readings(source, readings)


@dataclass
class Member:
    node: str
    agent: EtcdAgent
    leader: RackLeader
    pdu: CountingPdu
    fed: list[Reading] = field(default_factory=list)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def crash(self) -> None:
        """Die without a goodbye: the lease is left to expire."""
        for t in self.tasks:
            t.cancel()


@contextlib.asynccontextmanager
async def rack(
    url: str, prefix: str, nodes: Sequence[str], pdu_type: type[CountingPdu] = CountingPdu
) -> AsyncIterator[list[Member]]:
    members = []
    for node in nodes:
        agent = EtcdAgent(EtcdClient([url], timeout_s=0.5), node, prefix=prefix, lease_ttl_s=TTL_S)
        pdu = pdu_type()
        sink = Sink()
        runner = SourceRunner(pdu, SourceTiming(0.1, 0.08, 0.1, 0.2, 3), sink)
        leader = RackLeader(agent, "a", [runner].copy, sink)
        sink.leader = leader
        fed = sink.fed
        m = Member(node, agent, leader, pdu, fed)
        m.tasks = [asyncio.create_task(agent.run()), asyncio.create_task(leader.run())]
        members.append(m)
    try:
        yield members
    finally:
        for m in members:
            m.crash()
        for m in members:
            await asyncio.gather(*m.tasks, return_exceptions=True)
            await m.agent.etcd.close()


@pytest.mark.usefixtures("etcd_server")
async def test_one_agent_polls_the_rack_the_others_read_and_a_dead_leader_is_replaced(
    etcd_server: EtcdServer, prefix: str
) -> None:
    async with rack(etcd_server.url, prefix, ("a1", "a2", "a3")) as members:
        await wait_until(
            lambda: sum(m.leader.leading for m in members) == 1, timeout=10, what="one leader"
        )
        lead = next(m for m in members if m.leader.leading)
        others = [m for m in members if m is not lead]
        await wait_until(
            lambda: all(len(m.fed) >= 3 for m in others), timeout=10, what="followers fed"
        )
        # Until they joined etcd each polled for itself; from now on only the leader does.
        polls = [m.pdu.polls for m in others]
        fed = [len(m.fed) for m in others]
        await wait_until(
            lambda: all(len(m.fed) >= n + 5 for m, n in zip(others, fed, strict=True)),
            timeout=10,
            what="followers fed from etcd",
        )
        assert [m.pdu.polls for m in others] == polls  # one poller for the rack, not three
        shared = others[0].fed[-1]
        assert shared.sensor == "inlet.top" and shared.labels == {"probe": "top"}
        assert 0.0 <= time.monotonic() - shared.mono < 5.0  # aged, on this host's clock
        # The leader dies; within one lease TTL another agent leads and polls.
        lead.crash()
        died = time.monotonic()
        await wait_until(
            lambda: any(m.leader.leading for m in others), timeout=TTL_S + 5, what="takeover"
        )
        took = time.monotonic() - died
        new = next(m for m in others if m.leader.leading)
        rest = next(m for m in others if m is not new)
        before, rest_polls = len(rest.fed), rest.pdu.polls
        await wait_until(
            lambda: new.pdu.polls >= 2 and len(rest.fed) > before + 2,
            timeout=10,
            what="readings flowing again",
        )
        assert rest.pdu.polls == rest_polls
        assert took <= TTL_S + 2.0, took  # expiry (TTL) plus one election round


async def test_without_etcd_every_agent_polls_its_own(prefix: str) -> None:
    # etcd never reachable: "as today", each agent runs its rack sources itself.
    async with rack("http://127.0.0.1:9", prefix, ("b1", "b2")) as members:
        await wait_until(
            lambda: all(m.pdu.polls >= 2 for m in members), timeout=10, what="each polls"
        )
        assert not any(m.leader.leading for m in members)


class StrayCancelPdu(CountingPdu):
    """Its second poll ends in a library's CancelledError, as asyncua's can."""

    async def read(self) -> Sequence[Reading]:
        readings = await super().read()
        if self.polls == 2:
            raise CancelledWithResult()
        return readings


async def test_a_rack_source_ended_by_a_cancellation_no_one_asked_for_is_restarted(
    prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    # etcd away: the agent runs its rack source itself, through the leader.
    async with rack("http://127.0.0.1:9", prefix, ("b1",), StrayCancelPdu) as (member,):
        await wait_until(lambda: member.pdu.polls >= 6, timeout=10, what="polls past it")
        assert all(not t.done() for t in member.tasks)
    restarts = [r for r in caplog.records if "no one asked for" in r.getMessage()]
    assert [r.levelno for r in restarts] == [logging.ERROR]
    assert restarts[0].getMessage().startswith("pdu: rack source ended by a cancellation")
