"""The node page at `/`, in headless Chromium against a real daemon on the fake NVML.

The screenshot is kept as a test artifact: under the test's tmp_path, and copied to
out/node-page.png in the repository (git-ignored) so CI and a person can look at it.
"""

from __future__ import annotations

import asyncio
import re
import shutil
from pathlib import Path

import aiohttp

from fakes.nvml import fake_node
from fakes.scheduler import FakeWebhookScheduler
from tests.support.browser import chromium_page
from tests.support.daemon_harness import running_daemon
from tests.support.paths import ROOT
from tests.support.secrets import WEBHOOK_SECRET
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


async def _chromium_cli(*args: str) -> bytes:
    """Plain headless Chromium, as FIELD-NOTES.md runs it: no DevTools, no waiting flags."""
    proc = await asyncio.create_subprocess_exec(
        require("chromium"),
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--window-size=1280,900",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == 0
    return out


async def test_the_page_shows_data_at_load_to_a_plain_chromium_screenshot(
    receiver: FakeWebhookScheduler, secret_file: Path, tmp_path: Path
) -> None:
    nvml = fake_node()
    for g in nvml.gpus:
        g.temperature_c = 50.0
    nvml.gpus[5].temperature_c = 86.0
    async with running_daemon(nvml, receiver, secret_file) as daemon:
        await wait_until(lambda: receiver.node_state.get("gpu-node-07") == "drained")
        await wait_until(lambda: not daemon.decisions.pending(), what="the drain confirmed")
        url = f"http://127.0.0.1:{daemon.api_port}/"
        # What Chromium holds at its load event, with no --virtual-time-budget:
        # the data came with the page, not from a fetch after it.
        dom = (await _chromium_cli("--dump-dom", url)).decode()
        shot = tmp_path / "node-page-at-load.png"
        await _chromium_cli(f"--screenshot={shot}", url)
    assert 'data-gpu="5" data-condition="warning"' in dom
    assert "86.0 °C" in dom and dom.count("<figure") == 8 and 'class="slowdown"' in dom
    assert 'data-status="confirmed"' in dom and "accepted by the scheduler at " in dom
    assert 'id="simulated" class="simulated">' in dom  # the banner shown (not hidden)
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
