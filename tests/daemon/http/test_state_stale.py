"""/v1/state never shows a down source's last values as good: past the policy's stale limit
they are BAD, without value, the last value and the source's error in the reason."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp

from fakes.nvml import fake_node
from fakes.scheduler import FakeWebhookScheduler
from tests.support.daemon_harness import running_daemon
from tests.support.wait import wait_for_result


async def _state(port: int | None) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{port}/v1/state") as resp,
    ):
        assert resp.status == 200
        body = await resp.json()
        assert isinstance(body, dict)
        return body


def _gpu0(state: dict[str, Any]) -> dict[str, Any]:
    (series,) = [s for s in state["series"] if s["sensor"] == "gpu0.temperature"]
    assert isinstance(series, dict)
    return series


async def test_a_down_sources_values_turn_bad_when_the_policy_stops_using_them(
    receiver: FakeWebhookScheduler, secret_file: Path
) -> None:
    nvml = fake_node()
    nvml.gpus[0].temperature_c = 51.0
    async with running_daemon(nvml, receiver, secret_file) as daemon:
        live = _gpu0(await _state(daemon.api_port))
        assert live["quality"] == "good" and live["value"] == 51.0 and live["stale"] is False

        nvml.gpus[0].delay_s = 3.0  # NVML hangs: the source goes down, its values age
        # The series' age is read when the state is asked for, the condition at the
        # policy's last evaluation: wait for the evaluation after the values aged.
        state = await wait_for_result(
            lambda: _state(daemon.api_port),
            lambda s: (
                s["sources"]["gpus"]["health"] == "down"
                and _gpu0(s)["stale"]
                and s["condition"] == "unknown"
            ),
            what="gpus down, gpu0 stale and the node's condition unknown",
        )
        frozen = _gpu0(state)
        assert frozen["quality"] == "bad" and frozen["value"] is None
        assert frozen["age_s"] > 1.0  # the policy's stale_after_s in this config
        reason = frozen["reason"]
        assert reason.startswith("stale: ") and "last good value 51 celsius" in reason
        assert "source gpus:" in reason
        # Every series of the down source: none of them is shown good.
        gpus = [s for s in state["series"] if s["source"] == "gpus"]
        assert gpus and all(s["quality"] != "good" for s in gpus)
        nvml.gpus[0].delay_s = 0.0
