"""/metrics: Prometheus text format, conventional names and units, values from the state."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from fakes.nvml import fake_node
from fakes.scheduler import FakeWebhookScheduler
from tests.support.daemon_harness import running_daemon
from tests.support.wait import wait_until


async def scrape(port: int | None) -> dict[str, list[tuple[dict[str, str], float]]]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{port}/metrics") as resp,
    ):
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = await resp.text()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


async def test_metrics_follow_the_state_and_count_decisions(
    receiver: FakeWebhookScheduler, secret_file: Path
) -> None:
    nvml = fake_node()
    for i, g in enumerate(nvml.gpus):
        g.temperature_c = 50.0 + i
    nvml.gpus[3].errors["nvmlDeviceGetTemperature"] = 999
    async with running_daemon(nvml, receiver, secret_file) as daemon:
        m = await scrape(daemon.api_port)
        temps = {labels["gpu"]: v for labels, v in m["rackguard_gpu_temperature_celsius"]}
        assert temps["0"] == 50.0 and temps["7"] == 57.0
        assert "3" not in temps  # a BAD reading is left out, never a made-up value
        margins = {labels["gpu"]: v for labels, v in m["rackguard_gpu_thermal_margin_celsius"]}
        assert margins["0"] == 40.0  # H100 slowdown 90 C from NVML, minus 50 C
        uuids = {labels["uuid"] for labels, _ in m["rackguard_gpu_temperature_celsius"]}
        assert len(uuids) == 7 and all(u.startswith("GPU-") for u in uuids)
        ((labels, up),) = m["rackguard_source_up"]
        assert labels == {"source": "gpus", "health": "up"} and up == 1.0
        count = dict((lb["source"], v) for lb, v in m["rackguard_poll_duration_seconds_count"])
        assert count["gpus"] >= 1
        assert m["rackguard_outbox_pending"] == [({}, 0.0)]
        assert "rackguard_decisions_total" not in m  # nothing decided yet

        nvml.gpus[3].errors.clear()
        nvml.gpus[6].temperature_c = 86.0
        await wait_until(lambda: receiver.node_state.get("gpu-node-07") == "drained")
        m = await scrape(daemon.api_port)
        assert m["rackguard_decisions_total"] == [({"action": "drain", "domain": "gpu"}, 1.0)]

        nvml.gpus[0].delay_s = 3.0  # NVML hangs: the last values turn stale
        await wait_until(lambda: daemon.runners[0].health.value == "down", 10)
        await asyncio.sleep(1.1)  # past stale_after_s (1 s in this config)
        m = await scrape(daemon.api_port)
        assert "rackguard_gpu_temperature_celsius" not in m  # no frozen, healthy-looking value
        assert m["rackguard_source_up"] == [({"source": "gpus", "health": "down"}, 0.0)]
        nvml.gpus[0].delay_s = 0.0
