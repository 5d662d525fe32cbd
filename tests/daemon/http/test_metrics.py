"""/metrics: Prometheus text format, conventional names and units, values from the state."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from adapters.sensors.nvml import NvmlAdapter
from daemon.app import Daemon
from daemon.config import parse_config
from fakes.nvml import fake_node
from fakes.scheduler import FakeWebhookScheduler
from fakes.slurmrestd import FakeSlurmrestd
from tests.support.daemon_harness import config_text, running_daemon
from tests.support.paths import ROOT
from tests.support.scrape import scrape
from tests.support.secrets import write_secret
from tests.support.wait import wait_for_result, wait_until


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
        assert m["rackguard_source_up"] == [({"source": "gpus"}, 1.0)]
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
        # Past stale_after_s (1 s in this config) the value is dropped, not frozen.
        m = await wait_for_result(
            lambda: scrape(daemon.api_port),
            lambda m: "rackguard_gpu_temperature_celsius" not in m,
            what="the stale temperatures dropped",
        )
        assert "rackguard_gpu_temperature_celsius" not in m  # no frozen, healthy-looking value
        # The same series, now 0: an alert on it keeps its history through the change.
        assert m["rackguard_source_up"] == [({"source": "gpus"}, 0.0)]
        health = {lb["health"]: v for lb, v in m["rackguard_source_health"]}
        assert health == {"starting": 0.0, "up": 0.0, "degraded": 0.0, "down": 1.0}
        nvml.gpus[0].delay_s = 0.0


async def test_job_notice_metrics_through_slurmrestd(tmp_path: Path) -> None:
    fake = FakeSlurmrestd(["gpu-node-07"])
    await fake.start()
    token = tmp_path / "jwt"
    write_secret(token, "token-root\n")
    job = fake.add_job("gpu-node-07")
    pinned = fake.add_job("gpu-node-07", requeue=False)
    scontrol = [sys.executable, str(ROOT / "fakes" / "scontrol.py"), fake.url]
    # The harness's node, GPUs and policy; Slurm through the fake for the scheduler.
    node = config_text("http://unused", tmp_path / "unused").split("[scheduler]")[0]
    text = f"""{node}
[scheduler]
type = "slurm"
rest_url = "{fake.url}"
token_file = "{token}"
scontrol = {json.dumps(scontrol)}
checkpoint_grace_s = 0.5
retry_initial_s = 0.05
retry_max_s = 0.1
outbox_path = "{tmp_path / "outbox.db"}"
"""
    nvml = fake_node()
    for g in nvml.gpus:
        g.temperature_c = 50.0
    daemon = Daemon(parse_config(text), adapters={"gpus": NvmlAdapter("gpus", nvml)})
    task = asyncio.create_task(daemon.run(handle_signals=False))
    try:
        await asyncio.wait_for(daemon.ready.wait(), 5)
        m = await scrape(daemon.api_port)
        assert m["rackguard_job_notices_pending"] == [({"scheduler": "slurm"}, 0.0)]
        assert {lb["result"]: v for lb, v in m["rackguard_job_signals_total"]} == {
            "done": 0.0,
            "gone": 0.0,
            "refused": 0.0,
        }
        nvml.gpus[6].temperature_c = 86.0  # a drain; its notice tells both jobs
        await wait_until(lambda: len(fake.jobs[pinned].signals) == 1, what="the signals")
        m = await scrape(daemon.api_port)
        opened = {lb["action"]: v for lb, v in m["rackguard_job_notices_total"]}
        assert opened == {"drain": 1.0, "exclude": 0.0}
        assert ({"scheduler": "slurm", "result": "done"}, 2.0) in m["rackguard_job_signals_total"]
        await wait_until(lambda: fake.jobs[job].state == "PENDING", what="the requeue")
        await wait_until(
            lambda: daemon.notices is not None and daemon.notices.open_count() == 0,
            what="the notice closed",
        )
        m = await scrape(daemon.api_port)
        requeues = {lb["result"]: v for lb, v in m["rackguard_job_requeues_total"]}
        assert requeues == {"done": 1.0, "gone": 0.0, "refused": 1.0}
        assert m["rackguard_job_notices_pending"] == [({"scheduler": "slurm"}, 0.0)]
        assert fake.jobs[pinned].state == "RUNNING"  # left running, counted as refused
    finally:
        daemon.stop()
        await asyncio.wait_for(task, 5)
        await fake.stop()
