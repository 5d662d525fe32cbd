"""The deliverer's watch: a decision undeliverable past the bound, and failures summed up."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import aiohttp
import pytest

from adapters.schedulers.webhook.sink import WebhookSink
from daemon.delivery.deliverer import Deliverer
from daemon.delivery.outbox import DecisionStore
from fakes.cdu_server import free_port
from fakes.nvml import fake_node
from fakes.scheduler import FakeWebhookScheduler
from policies.model import Action
from tests.support.daemon_harness import running_daemon
from tests.support.delivery import decision
from tests.support.scrape import scrape
from tests.support.secrets import WEBHOOK_SECRET
from tests.support.wait import wait_until


async def test_a_decision_undeliverable_past_the_bound_is_named_logged_once_and_cleared(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="daemon.delivery.deliverer")
    wall, mono = [1000.0], [50.0]
    port = free_port()
    store = DecisionStore(tmp_path / "o.db", wall=lambda: wall[0])
    sink = WebhookSink(f"http://127.0.0.1:{port}/rackguard", WEBHOOK_SECRET, timeout_s=1.0)
    deliverer = Deliverer(
        store,
        sink,
        retry_initial_s=0.01,
        retry_max_s=0.05,
        undeliverable_after_s=120.0,
        wall=lambda: wall[0],
        mono=lambda: mono[0],
    )
    task = asyncio.create_task(deliverer.run())
    receiver = FakeWebhookScheduler(WEBHOOK_SECRET)
    try:
        await store.submit(decision("gpu01", Action.EXCLUDE))
        await wait_until(lambda: store.pending()[0].attempts >= 3, what="failed attempts")
        deliverer.check()
        assert deliverer.undeliverable() == [] and deliverer.health()[0][0]

        wall[0] += 121  # past the bound
        deliverer.check()
        deliverer.check()
        (ok, reason), *_ = deliverer.health()
        assert not ok
        assert reason.startswith("gpu01 exclude (decision #1) undeliverable for 121s: ")
        assert "last error: " in reason and "127.0.0.1" in reason
        overdue = [r for r in caplog.records if "undeliverable for" in r.getMessage()]
        assert len(overdue) == 1 and overdue[0].levelno == logging.ERROR  # one per transition

        # The retries that follow the first WARNING are summed up once a minute.
        mono[0] += 61
        deliverer.check()
        summaries = [r for r in caplog.records if "delivery attempt(s) failed" in r.getMessage()]
        assert len(summaries) == 1 and summaries[0].levelno == logging.WARNING
        assert "unreachable" in summaries[0].getMessage()
        assert "oldest undelivered: gpu01 exclude for 121s" in summaries[0].getMessage()

        await receiver.start(port=port)
        await wait_until(lambda: not store.pending(), what="delivery once the receiver is back")
        deliverer.check()
        assert deliverer.health()[0][0]
        assert "decision #1: no longer undeliverable" in caplog.text
        assert [r.payload["action"] for r in receiver.received] == ["exclude"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await receiver.stop()
        await sink.close()
        store.close()


async def test_readyz_and_the_metric_name_a_drain_no_scheduler_took(secret_file: Path) -> None:
    nvml = fake_node()
    for g in nvml.gpus:
        g.temperature_c = 50.0
    receiver = FakeWebhookScheduler(WEBHOOK_SECRET)
    await receiver.start()
    await receiver.stop()  # its port now refuses: the scheduler is gone
    async with running_daemon(
        nvml, receiver, secret_file, scheduler_extra="undeliverable_after_s = 0.5"
    ) as daemon:
        base = f"http://127.0.0.1:{daemon.api_port}"
        nvml.gpus[2].temperature_c = 86.0
        await wait_until(lambda: daemon.engine.state.action.value == "drain", what="drain")
        async with aiohttp.ClientSession() as http:

            async def ready() -> dict[str, object]:
                async with http.get(f"{base}/readyz") as resp:
                    body: dict[str, object] = await resp.json()
                    assert (resp.status == 200) == body["ready"]
                    return body

            for _ in range(100):
                body = await ready()
                if not body["ready"]:
                    break
                await asyncio.sleep(0.05)
            assert body["ready"] is False
            problems = body["problems"]
            assert isinstance(problems, list) and len(problems) == 1
            problem = str(problems[0])
            assert "gpu-node-07 drain (decision #1) undeliverable for" in problem
            m = await scrape(daemon.api_port)
            assert m["rackguard_delivery_undeliverable"] == [({}, 1.0)]
            async with http.get(f"{base}/v1/decisions") as resp:
                (item,) = (await resp.json())["items"]
            assert item["delivery"]["status"] == "pending"
            assert item["delivery"]["attempts"] >= 1 and item["delivery"]["last_error"]
            async with http.get(f"{base}/v1/state") as resp:
                sched = (await resp.json())["scheduler"]
            assert sched["intent"] == "drain" and sched["delivery"] == "pending"
            assert sched["read_back"] is None  # the webhook cannot read a node back
