"""Decisions reach a real HTTP receiver: signed, retried through outages, coalesced,
kept across restarts by the outbox."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import random
from pathlib import Path

import pytest

from adapters.base import DeliveryError
from adapters.schedulers.webhook.sink import WebhookSink, sign
from daemon.config.outbox_path import MEMORY
from fakes.scheduler import FakeWebhookScheduler
from policies.model import REASON_PREFIX, Action, Decision, FaultDomain, idempotency_key
from tests.support.delivery import StoreAndDeliverer
from tests.support.secrets import WEBHOOK_SECRET as SECRET
from tests.support.wait import wait_until


def decision(node: str, action: Action, epoch: int = 1) -> Decision:
    return Decision(
        node,
        action,
        f"{REASON_PREFIX} test {action}",
        FaultDomain.GPU,
        1.0,
        idempotency_key(node, action, epoch),
    )


def test_signature_is_hmac_sha256_over_timestamp_and_body() -> None:
    expected = hmac.new(SECRET, b"123.{}", hashlib.sha256).hexdigest()
    assert sign(SECRET, "123", b"{}") == f"sha256={expected}"


async def test_webhook_delivers_signed_json(receiver: FakeWebhookScheduler) -> None:
    sink = WebhookSink(receiver.url, SECRET)
    try:
        await sink.deliver(decision("n1", Action.DRAIN))
    finally:
        await sink.close()
    (got,) = receiver.received
    assert got.payload["node"] == "n1" and got.payload["action"] == "drain"
    assert got.payload["reason"].startswith("rackguard:")
    assert got.key == idempotency_key("n1", Action.DRAIN, 1)
    assert receiver.node_state["n1"] == "drained"


async def test_the_payload_carries_the_deadline_of_each_action(
    receiver: FakeWebhookScheduler,
) -> None:
    sink = WebhookSink(receiver.url, SECRET, grace_s=(540.0, 20.0))
    try:
        for epoch, action in enumerate((Action.DRAIN, Action.EXCLUDE, Action.RESUME), 1):
            await sink.deliver(decision("n1", action, epoch))
    finally:
        await sink.close()
    # decision() is at Unix time 1.0: the grace counts from the decision.
    assert [r.payload["checkpoint_by"] for r in receiver.received] == [
        "1970-01-01T00:09:01Z",
        "1970-01-01T00:00:21Z",
        None,
    ]


async def test_wrong_secret_is_an_error_an_operator_fixes(receiver: FakeWebhookScheduler) -> None:
    sink = WebhookSink(receiver.url, b"wrong")
    try:
        with pytest.raises(DeliveryError) as info:
            await sink.deliver(decision("n1", Action.DRAIN))
    finally:
        await sink.close()
    assert info.value.permanent and not info.value.final and info.value.reason == "auth"
    assert "HTTP 401" in str(info.value)
    assert receiver.rejected_signatures == 1 and not receiver.received


async def test_5xx_and_refused_connections_are_transient(
    receiver: FakeWebhookScheduler,
) -> None:
    receiver.fail_next = 1
    sink = WebhookSink(receiver.url, SECRET)
    dead = WebhookSink("http://127.0.0.1:9/x", SECRET, timeout_s=1.0)
    try:
        with pytest.raises(DeliveryError) as info:
            await sink.deliver(decision("n1", Action.DRAIN))
        assert not info.value.permanent and "HTTP 503" in str(info.value)
        with pytest.raises(DeliveryError) as info2:
            await dead.deliver(decision("n1", Action.DRAIN))
        assert not info2.value.permanent
    finally:
        await sink.close()
        await dead.close()


async def run_queue(queue: StoreAndDeliverer) -> asyncio.Task[None]:
    task = asyncio.create_task(queue.run())
    await asyncio.sleep(0)
    return task


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_outage_delays_but_never_drops(receiver: FakeWebhookScheduler) -> None:
    receiver.fail_next = 4  # four 503s, then the scheduler is back
    sink = WebhookSink(receiver.url, SECRET)
    queue = StoreAndDeliverer(
        MEMORY, sink, retry_initial_s=0.1, retry_max_s=0.2, rng=random.Random(1)
    )
    task = await run_queue(queue)
    try:
        queue.submit(decision("n1", Action.DRAIN))
        # After the first 503 and before the fourth (0.1 s to 0.2 s apart): it waits, visible.
        await wait_until(lambda: receiver.fail_next < 4, what="a first failed attempt")
        assert receiver.fail_next > 0
        assert [p.decision.node for p in queue.pending()] == ["n1"]  # visible while waiting
        # The receiver records the request before the outbox has its answer:
        # wait for the confirmation itself.
        await wait_until(lambda: "n1" in queue.confirmed, what="n1 confirmed")
        assert len(receiver.received) == 1
        assert queue.confirmed["n1"] is Action.DRAIN and not queue.pending()
    finally:
        await stop(task)
        await sink.close()
        queue.close()


async def test_undelivered_drain_then_resume_sends_nothing(
    receiver: FakeWebhookScheduler,
) -> None:
    sink = WebhookSink(receiver.url, SECRET)
    queue = StoreAndDeliverer(
        MEMORY, sink, retry_initial_s=0.01, retry_max_s=0.02, rng=random.Random(2)
    )
    queue.submit(decision("n1", Action.DRAIN, 1))
    await queue.submit(decision("n1", Action.RESUME, 2))
    assert queue.pending() == []
    queue.submit(decision("n2", Action.DRAIN, 1))
    queue.submit(decision("n2", Action.EXCLUDE, 2))  # escalation replaces the drain
    assert [p.decision.action for p in queue.pending()] == [Action.EXCLUDE]
    task = await run_queue(queue)
    try:
        # Once the exclusion is confirmed the queue holds nothing more to send.
        await wait_until(lambda: "n2" in queue.confirmed, what="n2 confirmed")
        assert queue.pending() == []
        assert [(r.payload["node"], r.payload["action"]) for r in receiver.received] == [
            ("n2", "exclude")
        ]
    finally:
        await stop(task)
        await sink.close()
        queue.close()


async def test_permanent_error_is_not_retried_forever(receiver: FakeWebhookScheduler) -> None:
    receiver.fail_next = 100
    receiver.fail_status = 400
    sink = WebhookSink(receiver.url, SECRET)
    queue = StoreAndDeliverer(
        MEMORY, sink, retry_initial_s=0.01, retry_max_s=0.01, rng=random.Random(3)
    )
    task = await run_queue(queue)
    try:
        queue.submit(decision("n1", Action.DRAIN))
        await wait_until(lambda: queue.failed, what="the decision given up")
        assert receiver.fail_next == 99  # exactly one attempt
        assert not queue.pending() and len(queue.failed) == 1
    finally:
        await stop(task)
        await sink.close()
        queue.close()


async def test_after_a_final_refusal_the_next_decision_is_still_delivered(
    receiver: FakeWebhookScheduler,
) -> None:
    receiver.fail_next, receiver.fail_status = 1, 422  # the drain's body is refused for good
    sink = WebhookSink(receiver.url, SECRET)
    queue = StoreAndDeliverer(MEMORY, sink, retry_initial_s=0.01, retry_max_s=0.01)
    task = await run_queue(queue)
    try:
        await queue.submit(decision("n1", Action.DRAIN, 1))
        await wait_until(lambda: queue.failed, what="the drain failed")
        await queue.submit(decision("n1", Action.EXCLUDE, 2))  # the node's intent now
        await wait_until(lambda: "n1" in queue.confirmed, what="the exclude confirmed")
        assert [r.payload["action"] for r in receiver.received] == ["exclude"]
        assert queue.deliverer.failures == {"malformed": 1}
    finally:
        await stop(task)
        await sink.close()
        queue.close()


async def test_dry_run_decisions_are_not_sent() -> None:
    queue = StoreAndDeliverer(MEMORY, None)
    d = Decision("n1", Action.DRAIN, f"{REASON_PREFIX} x", FaultDomain.GPU, 0.0, "k", dry_run=True)
    assert await queue.submit(d) is None
    assert queue.pending() == []
    queue.close()


async def test_webhook_decisions_survive_a_restart(
    receiver: FakeWebhookScheduler, tmp_path: Path
) -> None:
    db = tmp_path / "outbox.sqlite3"
    first = StoreAndDeliverer(db, None)
    stored = await first.submit(decision("n1", Action.DRAIN, 1))
    first.close()  # as if the process died before delivering
    sink = WebhookSink(receiver.url, SECRET)
    queue = StoreAndDeliverer(db, sink, retry_initial_s=0.01, retry_max_s=0.02)
    task = await run_queue(queue)
    try:
        await wait_until(lambda: not queue.pending(), what="the backlog delivered")
        assert [r.key for r in receiver.received] == [stored]
        assert stored and stored.startswith(idempotency_key("n1", Action.DRAIN, 1))
        assert queue.confirmed == {"n1": Action.DRAIN}
    finally:
        await stop(task)
        await sink.close()
        queue.close()


async def test_keys_reused_after_a_restart_reach_the_receiver_as_new(
    receiver: FakeWebhookScheduler, tmp_path: Path
) -> None:
    # The policy's epochs start again at 1 in a new process: the same key, a new decision.
    sink = WebhookSink(receiver.url, SECRET)
    queue = StoreAndDeliverer(tmp_path / "o.db", sink, retry_initial_s=0.01, retry_max_s=0.02)
    task = await run_queue(queue)
    try:
        for d in (
            decision("n1", Action.DRAIN, 1),
            decision("n1", Action.RESUME, 2),
            decision("n1", Action.DRAIN, 1),
        ):
            queue.submit(d)
            await wait_until(lambda: not queue.pending(), what=f"{d.action.value} delivered")
        assert [r.payload["action"] for r in receiver.received] == ["drain", "resume", "drain"]
        assert len({r.key for r in receiver.received}) == 3
        assert receiver.node_state["n1"] == "drained"
    finally:
        await stop(task)
        await sink.close()
        queue.close()
