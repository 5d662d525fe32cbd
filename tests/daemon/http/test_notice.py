"""GET /v1/node/notice and /v1/notices, and the docs' Python snippet run exactly as written."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from daemon.delivery.notices import JobNotices, NoticeSettings
from daemon.delivery.outbox import DecisionStore, Status
from daemon.http.notice import add_notice_routes
from policies.model import Action
from tests.support.delivery import decision
from tests.support.openapi import check
from tests.support.paths import ROOT
from tests.support.scripted_jobs import ScriptedJobs
from tests.support.serving import serving as serve_app
from tests.support.wait import wait_until

DOC = ROOT / "docs" / "schedulers.md"


def snippet() -> str:
    """The Python block that follows the notice-snippet marker in docs/schedulers.md."""
    text = DOC.read_text()
    after = text.split("<!-- notice-snippet -->", 1)[1]
    found = re.search(r"```python\n(.*?)```", after, re.S)
    assert found, "docs/schedulers.md: no python block after <!-- notice-snippet -->"
    return found.group(1)


@contextlib.asynccontextmanager
async def serving(notices: JobNotices | None) -> AsyncIterator[str]:
    app = web.Application()
    add_notice_routes(app, lambda: ("gpu01", notices))
    async with serve_app(app) as url:
        yield url


async def run_snippet(url: str, tmp_path: Path) -> str:
    script = tmp_path / "job.py"
    script.write_text(snippet())
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(script),
        env={"RACKGUARD_URL": url, "PATH": "/usr/bin:/bin"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=30)
    assert proc.returncode == 0, err.decode()
    return out.decode()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[DecisionStore]:
    s = DecisionStore(tmp_path / "o.db")
    yield s
    s.close()


async def test_the_docs_snippet_reads_an_open_notice(store: DecisionStore, tmp_path: Path) -> None:
    jobs = ScriptedJobs({"gpu01": ["11"]})
    notices = JobNotices(store, jobs, NoticeSettings(checkpoint_grace_s=300.0))
    task = asyncio.create_task(notices.run())
    try:
        notices.settled(decision("gpu01", Action.DRAIN), Status.CONFIRMED, "read back")
        await wait_until(lambda: (n := notices.current("gpu01")) is not None and n.told_at)
        async with serving(notices) as url:
            out = await run_snippet(url, tmp_path)
            async with aiohttp.ClientSession() as http:
                async with http.get(url + "/v1/node/notice") as resp:
                    body = await resp.json()
                async with http.get(url + "/v1/notices") as resp:
                    listed = await resp.json()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    seconds = int(re.fullmatch(r"rackguard: checkpoint within (\d+) s\n", out).group(1))  # type: ignore[union-attr]
    assert 0 < seconds <= 300
    check("NodeNotice", body)
    check("Notices", listed)
    notice = body["notice"]
    assert notice["checkpoint_by"] == pytest.approx(time.time() + 300, abs=60)
    assert notice["reason"].startswith("rackguard") and notice["domain"] == "gpu"
    assert [(j["job_id"], j["signal"], j["signaled"]) for j in notice["jobs"]] == [
        ("11", "USR1", "done")
    ]
    assert listed["notices"][0]["key"] == notice["key"]


async def test_the_snippet_says_nothing_without_a_notice_or_an_agent(tmp_path: Path) -> None:
    async with serving(None) as url:
        assert await run_snippet(url, tmp_path) == ""
        async with aiohttp.ClientSession() as http, http.get(url + "/v1/node/notice") as resp:
            body = await resp.json()
    check("NodeNotice", body)
    assert body == {"node": "gpu01", "notice": None}
    with socket.socket() as s:  # a port nothing listens on: no agent on this node
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    assert await run_snippet(closed, tmp_path) == ""
