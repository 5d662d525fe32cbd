"""The node page at `/`, in headless Chromium against a real daemon on the fake NVML.

The screenshot is kept as a test artifact: under the test's tmp_path, and copied to
out/node-page.png in the repository (git-ignored) so CI and a person can look at it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import time
from pathlib import Path
from typing import Any

import aiohttp

from adapters.schedulers.webhook.sink import WebhookSink
from daemon.app import Daemon
from fakes.demo import RackFakes
from fakes.nvml import fake_node
from fakes.scheduler import FakeWebhookScheduler
from fakes.sim import load_scenario
from fakes.sim.harness import Harness, ServeOptions
from tests.support.browser import chromium_page
from tests.support.daemon_harness import config_text, running, running_daemon
from tests.support.paths import ROOT
from tests.support.secrets import WEBHOOK_SECRET, write_secret
from tests.support.tools import require
from tests.support.wait import wait_until

ARTIFACT = ROOT / "out" / "node-page.png"


async def test_the_page_shows_the_hot_gpu_and_the_drain_live(
    receiver: FakeWebhookScheduler, secret_file: Path, tmp_path: Path
) -> None:
    nvml = fake_node()
    for i, g in enumerate(nvml.gpus):
        g.temperature_c = 55.0 + i
    async with running_daemon(nvml, receiver, secret_file) as daemon:
        url = f"http://127.0.0.1:{daemon.api_port}/"
        async with chromium_page(url, tmp_path / "profile") as page:
            await page.wait_for("document.querySelectorAll('#gpus tbody tr').length === 8")
            await page.wait_for("document.body.dataset.live === 'connected'")
            assert await page.evaluate("document.querySelector('#action').dataset.action") == (
                "resume"
            )
            await wait_until(lambda: daemon.events.subscriber_count > 0, what="the page's stream")

            nvml.gpus[6].temperature_c = 86.0  # 4 C from its 90 C slowdown
            await wait_until(lambda: receiver.node_state.get("gpu-node-07") == "drained")
            # What the page shows now came over /v1/events, not a reload.
            await page.wait_for("document.querySelector('#action').dataset.action === 'drain'")
            await page.wait_for(
                "document.querySelector('#timeline li[data-action=\"drain\"]') !== null"
            )
            await page.wait_for(
                "document.querySelector('#gpus tr[data-gpu=\"6\"]').dataset.condition !== 'ok'"
            )
            hot = await page.evaluate(
                "document.querySelector('#gpus tr[data-gpu=\"6\"]').innerText"
            )
            assert "86.0 °C" in hot and "4.0 °C" in hot  # temperature and margin
            cool = await page.evaluate(
                "document.querySelector('#gpus tr[data-gpu=\"0\"]').dataset.condition"
            )
            assert cool == "ok"
            timeline = await page.evaluate("document.querySelector('#timeline').innerText")
            assert "drain" in timeline and "gpu-node-07" in timeline
            # The webhook cannot read back: its answer confirms, and the page says which.
            await page.wait_for("document.querySelector('.delivery[data-status=\"confirmed\"]')")
            shown = await page.evaluate("document.querySelector('.delivery').innerText")
            assert re.fullmatch(r"accepted by the scheduler at \d\d:\d\d:\d\d", shown), shown
            await page.wait_for("document.querySelector('#scheduler').hidden")  # they agree
            # A chart per GPU: its temperature, the slowdown line, the forecast, the drain.
            assert await page.evaluate("document.querySelectorAll('#charts figure').length") == 8
            hot_chart = '#charts figure[data-gpu="gpu6"]'
            await page.wait_for(f"document.querySelector('{hot_chart} line.decision') !== null")
            for part in ("polyline.temp", "line.slowdown", "text.label"):
                assert await page.evaluate(f"!!document.querySelector('{hot_chart} {part}')"), part
            label = await page.evaluate(f"document.querySelector('{hot_chart} text').textContent")
            assert label == "slowdown 90 °C"
            # A trusted trend draws its band; an untrusted one a flat (persistence) forecast.
            drawn = await page.evaluate(
                "(() => { CHARTS = {...CHARTS, forecasts: [{gpu: 'gpu6', trusted: true,"
                " per_min: 1.2, low_per_min: 0.8, high_per_min: 1.6},"
                " {gpu: 'gpu0', trusted: false, per_min: null, low_per_min: null,"
                " high_per_min: null}]};"
                " renderCharts(Array.from(document.querySelectorAll('#gpus tbody tr'),"
                " (r) => ({subject: 'gpu' + r.dataset.gpu, value: 50, threshold: 90})),"
                " Date.now() / 1000);"
                " const q = (g, s) => document.querySelector(`#charts figure[data-gpu=${g}] ${s}`);"
                " return [!!q('gpu6', 'polygon.band'), !!q('gpu0', 'polygon.band'),"
                " q('gpu0', 'line.forecast').getAttribute('class')]; })()"
            )
            assert drawn == [True, False, "forecast persistence"]
            units = await page.evaluate(
                "[humane(39.94, 'liters_per_minute'), humane(1.0, 'bool'), humane(0, 'bool'),"
                " humane(151.2, 'kilopascals'), humane(2400, 'rpm')]"
            )
            assert units == ["39.9 L/min", "on", "off", "151.2 kPa", "2400 rpm"]
            png = await page.screenshot()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    shot = tmp_path / "node-page.png"
    shot.write_bytes(png)
    ARTIFACT.parent.mkdir(exist_ok=True)
    shutil.copyfile(shot, ARTIFACT)


async def test_the_page_shows_a_drain_the_scheduler_never_got(
    secret_file: Path, tmp_path: Path
) -> None:
    receiver = FakeWebhookScheduler(WEBHOOK_SECRET)
    await receiver.start()
    await receiver.stop()  # nothing listens there any more
    nvml = fake_node()
    async with running_daemon(nvml, receiver, secret_file) as daemon:
        url = f"http://127.0.0.1:{daemon.api_port}/"
        async with chromium_page(url, tmp_path / "profile") as page:
            await page.wait_for("document.querySelector('#timeline .empty') !== null")
            empty = await page.evaluate("document.querySelector('#timeline').innerText")
            assert empty.startswith("No decisions yet")
            sources = await page.evaluate("document.querySelector('#sources').innerText")
            assert "gpus: up" in sources
            await wait_until(lambda: daemon.events.subscriber_count > 0, what="the page's stream")
            nvml.gpus[1].temperature_c = 86.0
            await wait_until(
                lambda: any(p.last_error for p in daemon.decisions.pending()), what="a failure"
            )
            await page.wait_for("document.querySelector('.delivery[data-status=\"pending\"]')")
            await page.wait_for(
                "document.querySelector('#scheduler').textContent"
                ".startsWith('scheduler: not deliv')"
            )
            assert await page.evaluate("document.querySelector('#scheduler').hidden") is False
            line = await page.evaluate("document.querySelector('#timeline li').innerText")
            assert "drain" in line and "NOT DELIVERED" in line and "last error" in line
            assert await page.evaluate("document.querySelector('#action').dataset.action") == (
                "drain"
            )


async def test_the_page_says_a_lost_gpu_is_lost_not_unknown(
    receiver: FakeWebhookScheduler, secret_file: Path, tmp_path: Path
) -> None:
    nvml = fake_node()
    async with running_daemon(nvml, receiver, secret_file) as daemon:
        url = f"http://127.0.0.1:{daemon.api_port}/"
        async with chromium_page(url, tmp_path / "profile") as page:
            await wait_until(lambda: daemon.events.subscriber_count > 0, what="the page's stream")
            nvml.gpus[2].lost = True
            row = '#gpus tr[data-gpu="2"]'
            await page.wait_for(f"document.querySelector('{row}').dataset.condition === 'lost'")
            text = await page.evaluate(f"document.querySelector('{row}').innerText")
            assert "GPU lost: NVML cannot reach it (NVML_ERROR_GPU_IS_LOST)" in text
            assert "reset or a reboot" in text and "temperature bad" not in text
            other = await page.evaluate(
                "document.querySelector('#gpus tr[data-gpu=\"1\"]').innerText"
            )
            assert "lost" not in other


async def _chromium_cli(*args: str, size: str = "1280,900") -> bytes:
    """Plain headless Chromium, as FIELD-NOTES.md runs it: no DevTools, no waiting flags."""
    proc = await asyncio.create_subprocess_exec(
        require("chromium"),
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        f"--window-size={size}",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == 0
    return out


def _rack_sources(h: Harness, tmp: Path) -> str:
    """[sources.pdu] and [sources.cdu] reading the simulator's PDU (SNMP) and CDU (OPC UA)."""
    write_secret(tmp / "community", "public")
    ep = h.endpoints()
    pdu, cdu = ep["pdu"], ep["cdu"]
    return RackFakes(
        pdu["port"], tmp / "community", pdu["probe_positions"], cdu["url"], cdu["profile"]
    ).sources()


def _initial(dom: str) -> Any:
    """The data embedded in the page."""
    found = re.search(r'<script id="initial" type="application/json">(.*?)</script>', dom, re.S)
    assert found is not None
    return json.loads(found.group(1))


def _trusts(daemon: Daemon, gpu: str) -> bool:
    return any(f.trusted and f.gpu == gpu for f in daemon.view.gpu_forecasts())


async def test_the_page_shows_data_at_load_to_a_plain_chromium_screenshot(
    receiver: FakeWebhookScheduler, secret_file: Path, tmp_path: Path
) -> None:
    nvml = fake_node()
    for g in nvml.gpus:
        g.temperature_c = 50.0
    rack = Harness(
        load_scenario("pump-failure"),
        ServeOptions(state_dir=tmp_path / "sim", speed=1.0, pdu_port=0, cdu_port=0),
    )
    await rack.start()
    # A short trend window, so a steady warming is a trend the policy trusts in seconds.
    fast_trend = (
        "[policy]\ntrend_window_s = 12.0\ntrend_bucket_s = 1.0\nskill_horizon_s = 2.0\n"
        "max_gpu_rate_c_per_min = 600.0\nload_settle_s = 0.0\n"
    )
    text = config_text(receiver.url, secret_file).replace("[policy]\n", fast_trend)
    text += _rack_sources(rack, tmp_path)
    sink = WebhookSink(receiver.url, WEBHOOK_SECRET)
    try:
        async with running(text, nvml, sink=sink) as daemon:

            def charted(key: str) -> int:
                by_key = {s.key: s for s in daemon.view.charts().series}
                return len(by_key[key].points) if key in by_key else 0

            async def warm() -> None:  # GPU 2 warms 0.3 C/s, steadily
                while True:
                    nvml.gpus[2].temperature_c += 0.03
                    await asyncio.sleep(0.1)

            warming = asyncio.create_task(warm())
            try:
                # History from before the page is opened: three steps of the daemon's ring.
                await wait_until(lambda: charted("gpu5") >= 3, timeout=20, what="3 chart steps")
                await wait_until(lambda: charted("coolant_flow") >= 1, timeout=20, what="the loop")
                opened = time.time()
                nvml.gpus[5].temperature_c = 86.0
                await wait_until(lambda: receiver.node_state.get("gpu-node-07") == "drained")
                await wait_until(lambda: not daemon.decisions.pending(), what="the drain confirmed")
                url = f"http://127.0.0.1:{daemon.api_port}/"
                # What Chromium holds at its load event, with no --virtual-time-budget:
                # the data came with the page, not from a fetch after it. The trend's
                # trust is re-judged at each bucket: load again until it was trusted then.
                for _ in range(5):
                    await wait_until(lambda: _trusts(daemon, "gpu2"), timeout=20, what="a trend")
                    dom = (await _chromium_cli("--dump-dom", url)).decode()
                    if _initial(dom)["charts"]["forecasts"][2]["trusted"]:
                        break
                shot = tmp_path / "node-page-at-load.png"
                await _chromium_cli(f"--screenshot={shot}", url, size="1280,1500")
            finally:
                warming.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await warming
    finally:
        await rack.stop()
    assert 'data-gpu="5" data-condition="warning"' in dom
    assert "86.0 °C" in dom and dom.count("<figure data-gpu") == 8 and 'class="slowdown"' in dom
    assert 'data-status="confirmed"' in dom and "accepted by the scheduler at " in dom
    assert 'id="simulated" class="simulated">' in dom  # the banner shown (not hidden)
    # The GPU's history reaches back before the page was opened; its forecast is drawn.
    charts = _initial(dom)["charts"]
    gpu5 = next(s for s in charts["series"] if s["key"] == "gpu5")
    assert gpu5["points"][0][0] < opened - charts["step_s"] and gpu5["points"][-1][1] == 86.0
    assert [f["gpu"] for f in charts["forecasts"]] == [f"gpu{i}" for i in range(8)]
    assert 'class="forecast persistence"' in dom  # GPU 0: no trend
    trend = next(f for f in charts["forecasts"] if f["gpu"] == "gpu2")
    assert trend["trusted"] and trend["low_per_min"] <= trend["per_min"] <= trend["high_per_min"]
    assert 5 < trend["per_min"] < 40  # warming, about 18 C/min
    assert re.search(r'<figure data-gpu="gpu2"[^>]*>.*?<polygon class="band"', dom, re.S)
    # The rack's inlet air and the loop, each its own chart in people's units.
    for kind in ("inlet_temperature", "coolant_supply_temperature", "coolant_flow"):
        assert f'<figure data-kind="{kind}">' in dom, kind
    assert re.search(r"coolant flow [\d.]+ L/min", dom) and re.search(r"coolant dP [\d.]+ kPa", dom)
    assert re.search(r"inlet air \(\w+\) [\d.]+ °C", dom)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    ARTIFACT.parent.mkdir(exist_ok=True)
    shutil.copyfile(shot, ROOT / "out" / "node-page-at-load.png")


async def test_the_page_is_served_from_the_package_read_only(
    receiver: FakeWebhookScheduler, secret_file: Path
) -> None:
    nvml = fake_node()
    async with (
        running_daemon(nvml, receiver, secret_file) as daemon,
        aiohttp.ClientSession() as http,
    ):
        base = f"http://127.0.0.1:{daemon.api_port}"
        async with http.get(f"{base}/") as resp:
            assert resp.status == 200 and resp.content_type == "text/html"
            html = await resp.text()
            # Nothing from outside the agent: no absolute URL to load.
            assert "http://" not in html and "https://" not in html
            assert "'self'" in resp.headers["Content-Security-Policy"]
        async with http.get(f"{base}/static/page.js") as resp:
            assert resp.status == 200 and resp.content_type == "text/javascript"
            assert "https://" not in await resp.text()
        for bad in ("/static/../api.py", "/static/nope.js", "/static/index.html"):
            async with http.get(base + bad) as resp:
                assert resp.status == 404, bad
        async with http.post(f"{base}/", data=b"x") as resp:
            assert resp.status == 405
