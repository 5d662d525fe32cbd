"""Hostile clients: huge numbers, NaN, too many streams and connections, reads off loopback."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import aiohttp
import pytest

from fakes.nvml import fake_node
from fakes.scheduler import FakeWebhookScheduler
from tests.support.daemon_harness import running_daemon
from tests.support.secrets import write_secret
from tests.support.wait import wait_until

TOKEN = "limits-token"
HUGE = "9" * 5000


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "api.token"
    write_secret(path, TOKEN + "\n")
    return path


async def status_of(http: aiohttp.ClientSession, url: str, **kw: object) -> tuple[int, str]:
    async with http.get(url, **kw) as resp:  # type: ignore[arg-type]
        return resp.status, (await resp.json())["error"]["code"] if resp.status >= 400 else ""


async def test_numbers_python_cannot_parse_and_nan_are_400s(
    receiver: FakeWebhookScheduler, secret_file: Path
) -> None:
    async with (
        running_daemon(fake_node(), receiver, secret_file) as daemon,
        aiohttp.ClientSession() as http,
    ):
        base = f"http://127.0.0.1:{daemon.api_port}"
        for url, kw in (
            (f"{base}/v1/events", {"headers": {"Last-Event-ID": HUGE}}),
            (f"{base}/v1/events?last_event_id={HUGE}", {}),
            (f"{base}/v1/decisions?limit={HUGE}", {}),
            (f"{base}/v1/decisions?since=nan", {}),
            (f"{base}/v1/decisions?until=inf", {}),
            (f"{base}/v1/decisions?since={HUGE}", {}),
            (f"{base}/v1/decisions?since=-1e999", {}),
        ):
            assert await status_of(http, url, **kw) == (400, "bad_parameter"), url
        assert (await status_of(http, f"{base}/v1/decisions?since=1700000000"))[0] == 200


async def test_event_streams_past_the_cap_get_503_and_a_stream_may_open_again(
    receiver: FakeWebhookScheduler, secret_file: Path
) -> None:
    async with (
        running_daemon(
            fake_node(), receiver, secret_file, api_extra="max_event_streams = 2"
        ) as daemon,
        aiohttp.ClientSession() as http,
    ):
        url = f"http://127.0.0.1:{daemon.api_port}/v1/events"
        first = await http.get(url)
        second = await http.get(url)
        assert first.status == second.status == 200
        assert await status_of(http, url) == (503, "too_many_streams")
        first.close()

        async def third_opens() -> bool:
            async with http.get(url) as resp:
                return resp.status == 200

        ok = False
        for _ in range(100):  # the server notices the closed stream at its next write
            daemon.events.publish("ping", {})
            if await third_opens():
                ok = True
                break
        second.close()
        assert ok


async def test_connections_past_the_cap_get_503_and_are_closed(
    receiver: FakeWebhookScheduler, secret_file: Path
) -> None:
    async with running_daemon(
        fake_node(), receiver, secret_file, api_extra="max_connections = 3\nmax_event_streams = 1"
    ) as daemon:
        port = daemon.api_port
        assert port is not None
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
        for r, w in held:  # one answered request each: all three are being served
            w.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await r.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200 ")
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), 5)  # read to EOF: it is closed
        assert answer.startswith(b"HTTP/1.1 503 ") and b"too_many_connections" in answer
        writer.close()
        for _, w in held:
            w.close()

        async def healthz() -> int:
            async with aiohttp.ClientSession() as http:
                return (await status_of(http, f"http://127.0.0.1:{port}/healthz"))[0]

        statuses = [await healthz()]
        while statuses[-1] != 200 and len(statuses) < 200:  # until the server saw the closes
            statuses.append(await healthz())
        assert statuses[-1] == 200  # below the cap again


async def test_reads_off_loopback_need_the_token_probes_do_not(
    receiver: FakeWebhookScheduler, secret_file: Path, token_file: Path
) -> None:
    async with (
        running_daemon(
            fake_node(),
            receiver,
            secret_file,
            api_extra=f'listen = "0.0.0.0"\ntoken_file = "{token_file}"',
        ) as daemon,
        aiohttp.ClientSession() as http,
    ):
        base = f"http://127.0.0.1:{daemon.api_port}"
        assert await status_of(http, f"{base}/v1/state") == (401, "unauthorized")
        assert await status_of(http, f"{base}/metrics") == (401, "unauthorized")
        auth = {"Authorization": f"Bearer {TOKEN}"}
        assert (await status_of(http, f"{base}/v1/state", headers=auth))[0] == 200
        assert (await status_of(http, f"{base}/healthz"))[0] == 200
        assert (await status_of(http, f"{base}/readyz"))[0] == 200
        # HEAD (served by the GET handlers) and every other method: authorised as GET is.
        for path in ("/v1/state", "/v1/decisions", "/metrics", "/v1/events", "/v1/notices", "/"):
            for method in ("HEAD", "OPTIONS", "PUT", "DELETE", "TRACE", "PATCH"):
                async with http.request(method, base + path) as resp:
                    assert resp.status == 401, (method, path)
        async with http.head(f"{base}/v1/state", headers=auth) as resp:
            assert resp.status == 200


async def test_head_on_the_event_stream_holds_no_slot(
    receiver: FakeWebhookScheduler, secret_file: Path
) -> None:
    async with (
        running_daemon(
            fake_node(), receiver, secret_file, api_extra="max_event_streams = 1"
        ) as daemon,
    ):
        held = []
        for _ in range(4):
            reader, writer = await asyncio.open_connection("127.0.0.1", daemon.api_port)
            writer.write(b"HEAD /v1/events HTTP/1.1\r\nHost: x\r\n\r\n")
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 ")
            held.append(writer)  # kept open, as the attack did
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{daemon.api_port}/v1/events") as resp,
        ):
            assert resp.status == 200  # the one real stream still has its slot
        for writer in held:
            writer.close()


async def test_a_client_leaving_an_event_stream_logs_no_error(
    receiver: FakeWebhookScheduler,
    secret_file: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import daemon.http.api  # noqa: PLC0415

    monkeypatch.setattr(daemon.http.api, "SSE_HEARTBEAT_S", 0.05)
    caplog.set_level(logging.DEBUG)
    async with running_daemon(fake_node(), receiver, secret_file) as d:
        for _ in range(5):
            reader, writer = await asyncio.open_connection("127.0.0.1", d.api_port)
            writer.write(b"GET /v1/events HTTP/1.1\r\nHost: x\r\n\r\n")
            await reader.readuntil(b"\r\n\r\n")
            writer.transport.abort()  # gone without a word, as a killed client is
        await wait_until(
            lambda: sum("disconnected" in r.getMessage() for r in caplog.records) >= 5,
            what="five disconnects noticed",
        )
    api_side = [r for r in caplog.records if r.name.startswith(("aiohttp", "daemon.http"))]
    bad = [r for r in api_side if r.levelno >= logging.WARNING]
    assert not bad, [r.getMessage() for r in bad]
    assert not [r for r in caplog.records if r.exc_info]
    assert sum(r.levelno == logging.DEBUG for r in api_side) <= 10  # one line per client at most
