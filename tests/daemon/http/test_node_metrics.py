"""The families operators alert on: identity, condition, action, backlog, per-GPU forecast."""

from __future__ import annotations

import platform
from pathlib import Path

import aiohttp
import pynvml

from daemon.version import package_version
from fakes.nvml import fake_node
from fakes.scheduler import FakeWebhookScheduler
from tests.support.daemon_harness import running_daemon
from tests.support.scrape import Samples, scrape
from tests.support.wait import wait_until


def one(m: Samples, name: str, **labels: str) -> float:
    """The value of the one sample of ``name`` whose labels include ``labels``."""
    found = [v for lb, v in m.get(name, []) if labels.items() <= lb.items()]
    assert len(found) == 1, f"{name}{labels}: {m.get(name)}"
    return found[0]


async def test_condition_action_and_backlog_follow_a_drain_the_scheduler_refuses(
    receiver: FakeWebhookScheduler, secret_file: Path
) -> None:
    nvml = fake_node()
    for g in nvml.gpus:
        g.temperature_c = 50.0
    receiver.fail_next = 10**6  # the scheduler answers 503 until told otherwise
    async with running_daemon(nvml, receiver, secret_file) as daemon:
        port = daemon.api_port
        m = await scrape(port)
        (labels, value), *more = m["rackguard_build_info"]
        assert not more and value == 1.0
        assert labels == {
            "version": package_version(),
            "python": platform.python_version(),
            "nvml_driver_version": "550.54.15",
        }
        # The first evaluations may come before every series is in: UNKNOWN, then OK.
        await wait_until(
            lambda: daemon.engine.last is not None and daemon.engine.last.node.condition == "ok"
        )
        m = await scrape(port)
        assert one(m, "rackguard_node_condition", condition="ok") == 1.0
        assert sum(v for _, v in m["rackguard_node_condition"]) == 1.0
        assert one(m, "rackguard_node_action", action="resume") == 1.0
        assert one(m, "rackguard_ready") == 1.0
        assert one(m, "rackguard_storm_breaker_open") == 0.0
        assert one(m, "rackguard_outbox_oldest_pending_age_seconds") == 0.0
        assert one(m, "rackguard_gpu_slowdown_temperature_celsius", gpu="6") == 90.0
        assert one(m, "process_cpu_seconds_total") > 0
        assert one(m, "process_resident_memory_bytes") > 0

        nvml.gpus[6].temperature_c = 86.0  # 4 C from slowdown: drain
        await wait_until(lambda: daemon.engine.state.action.value == "drain", what="drain")
        await wait_until(
            lambda: any(p.attempts > 1 for p in daemon.decisions.pending()), what="a retry"
        )
        m = await scrape(port)
        assert one(m, "rackguard_node_condition", condition="warning") == 1.0
        assert one(m, "rackguard_node_condition", condition="ok") == 0.0
        assert one(m, "rackguard_node_action", action="drain") == 1.0
        assert one(m, "rackguard_gpu_condition", gpu="6", condition="ok") == 0.0
        assert one(m, "rackguard_gpu_condition", gpu="0", condition="ok") == 1.0
        assert one(m, "rackguard_outbox_pending_retrying") == 1.0
        assert one(m, "rackguard_outbox_oldest_pending_age_seconds") > 0.0

        receiver.fail_next = 0
        await wait_until(lambda: not daemon.decisions.pending(), what="delivery")
        m = await scrape(port)
        assert one(m, "rackguard_outbox_pending_retrying") == 0.0
        assert one(m, "rackguard_outbox_oldest_pending_age_seconds") == 0.0
        assert one(m, "rackguard_node_action", action="drain") == 1.0


async def test_a_source_that_never_reported_is_not_ready_and_its_condition_unknown(
    receiver: FakeWebhookScheduler, secret_file: Path
) -> None:
    nvml = fake_node()
    nvml.init_error = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    async with running_daemon(nvml, receiver, secret_file) as daemon:
        await wait_until(lambda: daemon.engine.last is not None)
        m = await scrape(daemon.api_port)
        assert one(m, "rackguard_ready") == 0.0
        assert one(m, "rackguard_source_up", source="gpus") == 0.0
        assert one(m, "rackguard_source_health", source="gpus", health="up") == 0.0
        assert one(m, "rackguard_node_condition", condition="unknown") == 1.0
        (labels, _), *more = m["rackguard_build_info"]
        assert not more and labels["nvml_driver_version"] == ""  # no GPU reading names one
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{daemon.api_port}/readyz") as resp,
        ):
            assert resp.status == 503  # the metric and the probe agree
