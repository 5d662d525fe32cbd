"""Chaos on real daemon processes: the simulated node, a webhook receiver, injected faults.

Each case asserts what an operator on a bad day needs: the daemon is alive and
ready again once the fault clears, no traceback reaches the log, every log
record is one journald line, and the log stays small.
(The storage faults — full disk, read-only remount, stalls — live with the
outbox's own chaos tests.)
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import resource
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from fakes.scheduler import FakeWebhookScheduler
from tests.support.daemon_harness import SIMULATED_RACKGUARD
from tests.support.paths import ROOT
from tests.support.secrets import WEBHOOK_SECRET, write_secret
from tests.support.wait import wait_for_result, wait_until

NODE = "chaos-07"
TOKEN = "chaos-token"
JOURNALD_LINE = re.compile(r"^<[0-7]>[\w.]+: ")
# The faults below each take a handful of records (start, refusal, recovery,
# stop); a per-client or per-retry record would blow past this at once.
MAX_LOG_LINES = 80


def config(secret: Path, url: str, *, sources: str = "", api: str = "") -> str:
    return f"""
# Temperature probes of the chaos node.
[node]
name = "{NODE}"
[logging]
format = "journald"
[api]
port = 0
{api}
[sources.gpus]
type = "nvml"
interval_s = 0.1
timeout_s = 0.05
{sources}
[policy]
# Hot enough to drain the resting simulated node (margins of 47-49 C).
enter_margin_c = 50.0
exit_margin_c = 60.0
min_dwell_s = 0.0
[scheduler]
type = "webhook"
url = "{url}"
secret_file = "{secret}"
retry_initial_s = 0.2
retry_max_s = 1.0
"""


@dataclass
class Agent:
    """A `rackguard run` process on the simulated node, its config and its log."""

    proc: asyncio.subprocess.Process
    cfg: Path
    log: Path
    port: int = 0

    def lines(self) -> list[str]:
        return self.log.read_text(errors="replace").splitlines()

    async def api(self, http: aiohttp.ClientSession, path: str) -> tuple[int, Any]:
        async with http.get(f"http://127.0.0.1:{self.port}{path}") as resp:
            body = await (resp.json() if resp.content_type == "application/json" else resp.text())
            return resp.status, body

    async def ready(self, http: aiohttp.ClientSession) -> None:
        assert self.proc.returncode is None, "\n".join(self.lines()[-20:])
        await wait_for_result(lambda: self.api(http, "/readyz"), lambda r: r[0] == 200, 20)

    async def logged(self, text: str, count: int = 1) -> None:
        def seen() -> bool:
            assert self.proc.returncode is None, "\n".join(self.lines()[-20:])
            return sum(text in line for line in self.lines()) >= count

        await wait_until(seen, 20, what=repr(text))

    def assert_clean(self) -> None:
        lines = self.lines()
        assert not [line for line in lines if "Traceback" in line], lines
        assert all(JOURNALD_LINE.match(line) for line in lines), [
            line for line in lines if not JOURNALD_LINE.match(line)
        ][:5]
        assert len(lines) <= MAX_LOG_LINES, lines


@pytest.fixture
async def agent(
    tmp_path: Path, receiver: FakeWebhookScheduler, request: pytest.FixtureRequest
) -> AsyncIterator[Agent]:
    secret = tmp_path / "webhook.key"
    write_secret(secret, WEBHOOK_SECRET)
    cfg = tmp_path / "rg.toml"
    cfg.write_text(config(secret, receiver.url))
    log = tmp_path / "rackguard.log"
    nofile = getattr(request, "param", None)
    token = tmp_path / "api.token"
    write_secret(token, TOKEN)
    cfg.write_text(config(secret, receiver.url, api=f'token_file = "{token}"'))

    def limit_files() -> None:  # in the child, before exec
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            *SIMULATED_RACKGUARD,
            "run",
            "--config",
            str(cfg),
            cwd=ROOT,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=out,
            preexec_fn=limit_files,
        )
    a = Agent(proc, cfg, log)
    try:
        await a.logged("API on http://")
        (line,) = [x for x in a.lines() if "API on http://" in x]
        a.port = int(line.rsplit(":", 1)[1])
        yield a
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                rc = await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()
                raise
            assert rc == 0, "\n".join(a.lines()[-20:])


def reload(agent: Agent) -> None:
    agent.proc.send_signal(signal.SIGHUP)


async def test_a_non_utf8_config_on_sighup_keeps_it_running(
    agent: Agent, receiver: FakeWebhookScheduler
) -> None:
    async with aiohttp.ClientSession() as http:
        await agent.ready(http)
        good = agent.cfg.read_bytes()
        agent.cfg.write_bytes(good.replace(b"Temperature", b"Temp\xe9rature"))  # Latin-1
        reload(agent)
        await agent.logged("refused, keeping the running config")
        (refusal,) = [x for x in agent.lines() if "refused" in x]
        assert refusal.startswith("<3>") and "not UTF-8" in refusal and str(agent.cfg) in refusal
        await agent.ready(http)
        await wait_until(lambda: receiver.node_state.get(NODE) == "drained", 20, what="drain")
        # Fixed (and changed): the next SIGHUP applies it.
        agent.cfg.write_bytes(good.replace(b"interval_s = 0.1", b"interval_s = 0.2"))
        reload(agent)
        await agent.logged("configuration reloaded from")
        await agent.ready(http)
    agent.assert_clean()


async def test_a_reload_with_an_unbuildable_source_changes_nothing(agent: Agent) -> None:
    extra = '[sources.second]\ntype = "nvml"\ninterval_s = 0.1\ntimeout_s = 0.05\ngpus = [99]\n'
    async with aiohttp.ClientSession() as http:
        await agent.ready(http)
        good = agent.cfg.read_text()
        agent.cfg.write_text(good.replace("[policy]", extra + "[policy]"))
        reload(agent)
        await agent.logged("refused, keeping the running config")
        (refusal,) = [x for x in agent.lines() if "refused" in x]
        assert "sources.second: cannot connect" in refusal
        await agent.ready(http)
        status, state = await agent.api(http, "/v1/state")
        assert status == 200 and list(state["sources"]) == ["gpus"]
        assert state["sources"]["gpus"]["health"] == "up" and state["simulated"] is True
        _, metrics = await agent.api(http, "/metrics")
        assert 'rackguard_source_up{source="gpus"} 1.0' in metrics
        agent.cfg.write_text(good.replace("[policy]", extra.replace("[99]", "[1]") + "[policy]"))
        reload(agent)
        await agent.logged("configuration reloaded from")
        await agent.ready(http)
        _, state = await agent.api(http, "/v1/state")
        assert sorted(state["sources"]) == ["gpus", "second"]
    assert not any("cannot start after reload" in x for x in agent.lines())
    agent.assert_clean()


async def test_hostile_override_text_cannot_forge_log_records(agent: Agent) -> None:
    forged = "<3>daemon.app: chaos-07: stopped"
    body = {
        "action": "reset_storm",
        "actor": "mallory\n" + forged,
        "reason": "ok\r\n\x1b[2J\x1b[31mred\x00\u2028" + forged,
    }
    async with aiohttp.ClientSession() as http:
        await agent.ready(http)
        async with http.post(
            f"http://127.0.0.1:{agent.port}/v1/overrides",
            json=body,
            headers={"Authorization": f"Bearer {TOKEN}"},
        ) as resp:
            assert resp.status == 200, await resp.text()
        await agent.logged("override by mallory")
    (line,) = [x for x in agent.lines() if "override by" in x]
    assert line.startswith("<4>daemon.app: override by mallory\\n<3>")
    assert "\\x1b[2J" in line and "\\x00" in line and "\\u2028" in line
    assert not any(x.startswith(forged) for x in agent.lines())  # nothing forged
    agent.assert_clean()


CLIENTS = 1100


async def _hold_event_stream(
    port: int, release: asyncio.Event
) -> tuple[int, asyncio.StreamWriter | None]:
    """Open /v1/events and keep the socket busy until ``release``; the first status.

    A client told 503 on a kept-alive connection asks again now and then, so
    the connection never idles out: it holds its descriptor as long as it likes.
    """
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /v1/events HTTP/1.1\r\nHost: x\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
    except (OSError, asyncio.IncompleteReadError):
        return 0, None  # refused or reset: not served either
    status = int(head.split(b" ", 2)[1])
    if status == 503 and b"Connection: close" not in head:
        asyncio.get_running_loop().create_task(_keep_asking(reader, writer, release))
    return status, writer


async def _keep_asking(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, release: asyncio.Event
) -> None:
    with contextlib.suppress(OSError, asyncio.IncompleteReadError, TimeoutError):
        while not release.is_set():
            await reader.read(65536)  # the rest of the last answer
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(release.wait(), 2.0)  # well within the keep-alive
            if not release.is_set():
                writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                await writer.drain()
    writer.close()


# A file limit that 1,100 connections would exhaust many times over without the cap.
@pytest.mark.parametrize("agent", [400], indirect=True)
async def test_1100_event_stream_clients_cannot_starve_deliveries(
    agent: Agent, receiver: FakeWebhookScheduler
) -> None:
    receiver.fail_next = 10**9  # hold the drain back until the clients are in
    port = int(receiver.url.split(":")[2].split("/")[0])
    async with aiohttp.ClientSession() as http:
        await agent.ready(http)
        await wait_until(lambda: receiver.fail_next < 10**9, 20, what="a delivery attempt")
        # The receiver goes away with its kept-alive connection: the next
        # delivery needs a new socket, a file descriptor, while the clients hold theirs.
        await receiver.stop()
        release = asyncio.Event()
        results = await asyncio.gather(
            *(_hold_event_stream(agent.port, release) for _ in range(CLIENTS))
        )
        statuses = [s for s, _ in results]
        streams = statuses.count(200)
        assert 0 < streams <= 32  # the stream cap (the default)
        # The rest were told to come back later, or (past the refusals the daemon
        # answers at once) reset.
        assert statuses.count(200) + statuses.count(503) + statuses.count(0) == CLIENTS
        assert statuses.count(503) > 0
        # With every API slot taken, the drain still goes out.
        receiver.fail_next = 0
        await receiver.start(port=port)
        await wait_until(lambda: receiver.node_state.get(NODE) == "drained", 30, what="drain")
        assert agent.proc.returncode is None
        release.set()
        for _, writer in results:
            if writer is not None:
                writer.close()
        await agent.ready(http)
    lines = agent.lines()
    assert not any("Too many open files" in x for x in lines)
    agent.assert_clean()
