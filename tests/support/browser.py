"""Headless Chromium driven over the DevTools protocol: load a page, wait on its DOM, screenshot."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

from tests.support.tools import require

_LISTENING = re.compile(rb"DevTools listening on (ws://\S+)")


class Page:
    """One browser tab, commanded over its DevTools websocket."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self._ids = itertools.count(1)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one command and return its result (events in between are skipped)."""
        ident = next(self._ids)
        await self._ws.send_json({"id": ident, "method": method, "params": params})
        while True:
            msg = await self._ws.receive_json()
            if msg.get("id") == ident:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                result: dict[str, Any] = msg["result"]
                return result

    async def evaluate(self, expression: str) -> Any:
        """Evaluate JavaScript in the page (promises awaited); its value as JSON."""
        out = await self.call(
            "Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True
        )
        if "exceptionDetails" in out:
            raise RuntimeError(f"page script failed: {out['exceptionDetails']}")
        return out["result"].get("value")

    async def wait_for(self, condition: str, timeout_s: float = 20.0) -> None:
        """Wait, inside the page, until the JavaScript ``condition`` is true."""
        script = f"""new Promise((resolve, reject) => {{
            const until = Date.now() + {timeout_s * 1000};
            const tick = () => {{
                if ({condition}) return resolve(true);
                if (Date.now() > until) return reject(new Error("timed out: " + {condition!r}));
                setTimeout(tick, 50);
            }};
            tick();
        }})"""
        await self.evaluate(script)

    async def screenshot(self) -> bytes:
        """A PNG of the page."""
        shot = await self.call("Page.captureScreenshot", format="png")
        return base64.b64decode(shot["data"])


@contextlib.asynccontextmanager
async def chromium_page(url: str, profile: Path) -> AsyncIterator[Page]:
    """Debian's chromium, headless, with one tab that has loaded ``url``."""
    binary = require("chromium")
    proc = await asyncio.create_subprocess_exec(
        binary,
        "--headless=new",
        "--no-sandbox",  # as root in a container
        "--disable-gpu",
        "--no-first-run",
        "--remote-debugging-port=0",
        f"--user-data-dir={profile}",
        "--window-size=1280,900",
        "about:blank",
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stderr is not None
    try:
        async with asyncio.timeout(60):
            while True:
                line = await proc.stderr.readline()
                if not line:
                    raise RuntimeError("chromium exited before its DevTools endpoint was up")
                m = _LISTENING.search(line)
                if m:
                    break
        browser_ws = m.group(1).decode()
        http_base = "http://" + browser_ws.split("/")[2]
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{http_base}/json/list") as resp:
                targets = await resp.json()
            page_ws = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
            async with http.ws_connect(page_ws, max_msg_size=64 * 2**20) as ws:
                page = Page(ws)
                await page.call("Page.enable")
                await page.call("Page.navigate", url=url)
                await page.wait_for("document.readyState === 'complete'")
                yield page
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                async with asyncio.timeout(10):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
                await proc.wait()
