"""Peers' answers are read to a bounded size, and HTTP errors sort into the three kinds."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from adapters.base import DeliveryError, SchedulerSink, http_error
from adapters.schedulers.command import OUTPUT_LIMIT, OutputTooLarge, run_command
from adapters.schedulers.kubernetes.client import KubeClient, connection
from adapters.schedulers.kubernetes.sink import KubernetesSink
from adapters.schedulers.slurm.client import SlurmClient
from adapters.schedulers.slurm.sink import SlurmSink
from adapters.schedulers.webhook.sink import WebhookSink
from policies.model import Action
from tests.support.delivery import decision
from tests.support.secrets import WEBHOOK_SECRET
from tests.support.wait import wait_until

FLOOD_MB = 64


@pytest.fixture
async def flooding_peer() -> AsyncIterator[tuple[str, list[int]]]:
    """Answers every request 503 with a 64 MiB body; records how many MiB it got out."""
    sent = [0]

    async def handle(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(status=503)
        resp.content_length = FLOOD_MB * 2**20
        await resp.prepare(request)
        try:
            for _ in range(FLOOD_MB):
                await resp.write(b"x" * 2**20)
                sent[0] += 1
        except (ConnectionError, RuntimeError):
            pass  # the client hung up, as it should
        return resp

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}", sent
    await runner.cleanup()


async def test_a_flooding_command_is_refused_not_cut() -> None:
    # e.g. a token-refresh command gone wrong: 20 MB on stdout and stderr. A cut
    # answer read as a whole one (a job list) would hide what was cut.
    flood = "import sys; sys.stdout.write('x' * 20_000_000); sys.stderr.write('y' * 20_000_000)"
    with pytest.raises(OutputTooLarge, match=f"more than {OUTPUT_LIMIT} bytes"):
        await run_command([sys.executable, "-c", flood], timeout_s=30)


async def test_stderr_alone_is_cut_and_a_larger_limit_reads_stdout_whole() -> None:
    flood = "import sys; sys.stdout.write('x' * 200_000); sys.stderr.write('y' * 20_000_000)"
    rc, out, err = await run_command([sys.executable, "-c", flood], timeout_s=30, limit=200_000)
    assert rc == 0  # read to the end (the child never blocks on a full pipe)
    assert len(out) == 200_000 and len(err) == OUTPUT_LIMIT


@pytest.mark.parametrize(
    ("status", "final", "permanent", "reason"),
    [
        (400, True, True, "malformed"),
        (422, True, True, "malformed"),
        (401, False, True, "auth"),
        (403, False, True, "auth"),
        (404, False, True, "not_found"),
        (410, False, True, "refused"),
        (408, False, False, "unreachable"),
        (429, False, False, "unreachable"),
        (503, False, False, "unreachable"),
    ],
)
def test_http_errors_sort_into_transient_operator_fixable_and_final(
    status: int, final: bool, permanent: bool, reason: str
) -> None:
    err = http_error(f"HTTP {status}", status)
    assert (err.final, err.permanent, err.reason) == (final, permanent, reason)


@pytest.mark.parametrize("kind", ["webhook", "slurm", "kubernetes"])
async def test_a_huge_error_body_is_read_to_a_few_kib_by_every_sink(
    flooding_peer: tuple[str, list[int]], kind: str, tmp_path: Path
) -> None:
    url, sent = flooding_peer
    token = tmp_path / "token"
    token.write_text("t")
    sink: SchedulerSink
    if kind == "webhook":
        sink = WebhookSink(f"{url}/hook", WEBHOOK_SECRET)
    elif kind == "slurm":
        sink = SlurmSink(SlurmClient(url, timeout_s=30))
    else:
        sink = KubernetesSink(KubeClient(connection(api_url=url, token_file=token), timeout_s=30))
    try:
        with pytest.raises(DeliveryError) as info:
            await sink.deliver(decision("gpu01", Action.DRAIN))
    finally:
        await sink.close()
    assert "503" in str(info.value) and len(str(info.value)) < 1000
    assert sent[0] < FLOOD_MB  # the sink hung up instead of reading it all


async def test_a_cancelled_command_is_killed_and_reaped(tmp_path: Path) -> None:
    # A shutdown cancels an scontrol call in flight: the child must not outlive it.
    pid_file = tmp_path / "pid"
    script = (
        f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    )
    task = asyncio.create_task(run_command([sys.executable, "-c", script], timeout_s=60))
    await wait_until(lambda: pid_file.exists() and pid_file.read_text() != "", what="the child up")
    pid = int(pid_file.read_text())
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed and reaped: no process, not even a zombie
