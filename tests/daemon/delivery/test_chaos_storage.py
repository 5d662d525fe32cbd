"""Chaos on the storage-and-delivery path, against real daemon processes.

Each case starts ``rackguard run`` (fake NVML whose temperature the test sets
through a file, a webhook receiver in this process), injects one fault, heats
or cools the node so decisions are made during it, clears the fault, and
checks the promises: the daemon stays alive and is ready again; every decision
reached the receiver exactly once in effect (or is visible as failed, with a
metric); the log has no traceback and stays short.

Disk faults are real: the outbox lives on a small tmpfs (or an ext4 loop
device, for fsfreeze) mounted in a private mount namespace (``unshare -m``),
which the test fills, remounts read-only or freezes through ``nsenter``. Where
the kernel refuses a namespace or a freeze the case is skipped, saying why.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from fakes.scheduler import FakeWebhookScheduler
from tests.support.paths import ROOT
from tests.support.secrets import WEBHOOK_SECRET
from tests.support.wait import wait_for_result

HOT_C = 86.0  # 3 °C under the fake H100's slowdown temperature: a drain
COOL_C = 41.0
MAX_LOG_LINES = 120


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _namespaces_work() -> str:
    """ "" when a private mount namespace with a tmpfs can be made here, else why not."""
    if shutil.which("unshare") is None or shutil.which("nsenter") is None:
        return "unshare/nsenter not installed"
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt && echo ok"],
        capture_output=True,
        text=True,
        check=False,
    )
    return "" if probe.stdout.strip() == "ok" else f"unshare -m refused: {probe.stderr.strip()}"


NO_NAMESPACE = _namespaces_work()
needs_namespace = pytest.mark.skipif(bool(NO_NAMESPACE), reason=NO_NAMESPACE or "ok")


@dataclass
class Daemon:
    """One ``rackguard run`` process and what the test needs to poke at it."""

    work: Path
    url: str
    outbox: Path
    mount: str = ""  # shell run before the daemon inside its mount namespace ("" = none)
    port: int = field(default_factory=_free_port)
    proc: subprocess.Popen[bytes] | None = None
    scheduler_extra: str = ""
    readonly_flag: Path | None = None  # writes refused while it exists (tests.support.faulty_disk)

    @property
    def log(self) -> Path:
        return self.work / "daemon.log"

    @property
    def temp_file(self) -> Path:
        return self.work / "temperature"

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> Path:
        secret = self.work / "webhook.key"
        secret.write_bytes(WEBHOOK_SECRET)
        secret.chmod(0o600)
        cfg = self.work / "rg.toml"
        cfg.write_text(
            f"""
[node]
name = "gpu-node-07"
rack = "rack-b"
[api]
port = {self.port}
[sources.gpus]
type = "nvml"
interval_s = 0.1
timeout_s = 0.09
backoff_initial_s = 0.05
backoff_max_s = 0.2
[policy]
min_dwell_s = 0.0
resume_after_s = 0.2
stale_after_s = 2.0
evaluate_interval_s = 0.05
[scheduler]
type = "webhook"
url = "{self.url}"
secret_file = "{secret}"
timeout_s = 0.5
retry_initial_s = 0.05
retry_max_s = 0.1
outbox_path = "{self.outbox}"
{self.scheduler_extra}
"""
        )
        return cfg

    def start(self) -> None:
        self.set_temperature(COOL_C)
        cli = "fakes.nvml_module"  # rackguard on the simulated node
        if self.readonly_flag is not None:
            cli = f"tests.support.faulty_disk {self.readonly_flag}"
        run = f"exec {sys.executable} -m {cli} run --config {self.config()}"
        argv = ["sh", "-c", run]
        if self.mount:
            argv = ["unshare", "-m", "sh", "-c", f"{self.mount} && {run}"]
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "RACKGUARD_FAKE_GPUS": "2",
            "RACKGUARD_FAKE_TEMP_FILE": str(self.temp_file),
        }
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT
            )

    def set_temperature(self, celsius: float) -> None:
        tmp = self.temp_file.with_suffix(".new")
        tmp.write_text(f"{celsius}\n")
        tmp.replace(self.temp_file)

    def in_namespace(self, *argv: str, check: bool = True) -> None:
        """Run a command in the daemon's mount namespace (mount, fsfreeze)."""
        assert self.proc is not None
        nsenter = ["nsenter", "-t", str(self.proc.pid), "-m", *argv]
        subprocess.run(nsenter, check=check, capture_output=not check)

    def outbox_dir_seen_by_daemon(self) -> Path:
        """The outbox's directory as the daemon sees it (through its mount namespace)."""
        assert self.proc is not None
        return Path(f"/proc/{self.proc.pid}/root") / self.outbox.parent.relative_to("/")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


async def get(http: aiohttp.ClientSession, url: str, timeout_s: float = 2.0) -> tuple[int, Any]:
    async with http.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
        body = await resp.read()
        if resp.content_type == "application/json":
            return resp.status, orjson.loads(body)
        return resp.status, body.decode()


async def ready(http: aiohttp.ClientSession, d: Daemon) -> tuple[bool, list[str]]:
    try:
        status, body = await get(http, f"{d.base}/readyz")
    except (aiohttp.ClientError, TimeoutError):
        return False, ["no answer"]
    return status == 200, body.get("problems", []) if isinstance(body, dict) else []


async def metric(http: aiohttp.ClientSession, d: Daemon, name: str) -> float:
    """The sum of a metric's samples (0 if absent)."""
    _, text = await get(http, f"{d.base}/metrics")
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def decisions(http: aiohttp.ClientSession, d: Daemon) -> list[dict[str, Any]]:
    _, body = await get(http, f"{d.base}/v1/decisions?kind=decision&limit=500")
    items: list[dict[str, Any]] = body["items"]
    return items


def check_log(d: Daemon) -> str:
    text = d.log_text()
    assert "Traceback" not in text, text[-4000:]
    assert len(text.splitlines()) < MAX_LOG_LINES, text[-4000:]
    return text


def delivered_once_in_effect(receiver: FakeWebhookScheduler, keys: list[str]) -> None:
    """Every stored key reached the receiver, none twice (the receiver drops repeats)."""
    got = [r.key for r in receiver.received]
    assert len(got) == len(set(got)), got
    assert set(keys) <= set(got), (keys, got)


@contextlib.asynccontextmanager
async def running(
    d: Daemon, http: aiohttp.ClientSession, *, expect_ready: bool = True
) -> AsyncIterator[Daemon]:
    d.start()
    try:

        async def up() -> bool:
            assert d.alive(), d.log_text()[-4000:]
            return (await ready(http, d))[0]

        if expect_ready:
            await wait_for_result(up, bool, timeout=20.0, what="daemon ready")
        yield d
    finally:
        d.stop()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def ready_again_and_delivered(
    d: Daemon, receiver: FakeWebhookScheduler, http: aiohttp.ClientSession, what: str
) -> list[dict[str, Any]]:
    """Wait for /readyz 200, then check every stored decision reached the receiver once."""

    async def recovered() -> bool:
        return (await ready(http, d))[0]

    await wait_for_result(recovered, bool, timeout=20.0, what=f"ready again {what}")
    stored = await decisions(http, d)
    delivered_once_in_effect(receiver, [i["decision"]["key"] for i in stored])
    return stored


async def heat_until_delivered(
    d: Daemon, receiver: FakeWebhookScheduler, http: aiohttp.ClientSession, state: str
) -> None:
    d.set_temperature(HOT_C if state == "drained" else COOL_C)

    async def there() -> bool:
        return receiver.node_state.get("gpu-node-07") == state

    await wait_for_result(there, bool, timeout=20.0, what=f"receiver sees the node {state}")


# ---------------------------------------------------------------------- disk faults


@needs_namespace
async def test_a_full_disk_keeps_the_daemon_up_and_still_delivers(
    tmp_path: Path, receiver: FakeWebhookScheduler, http: aiohttp.ClientSession
) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    d = Daemon(
        tmp_path,
        receiver.url,
        disk / "outbox.sqlite3",
        mount=f"mount -t tmpfs -o size=512k tmpfs {disk}",
    )
    async with running(d, http):
        filler = d.outbox_dir_seen_by_daemon() / "filler"
        with contextlib.suppress(OSError), filler.open("wb") as fh:
            while True:
                fh.write(b"\0" * 65536)
                fh.flush()
        await heat_until_delivered(d, receiver, http, "drained")

        async def says_full() -> bool:
            ok, problems = await ready(http, d)
            return not ok and any("full" in p for p in problems)

        await wait_for_result(says_full, bool, timeout=20.0, what="/readyz reports the full disk")
        assert await metric(http, d, "rackguard_outbox_writable") == 0
        assert await metric(http, d, "rackguard_outbox_write_failures_total") >= 1
        await heat_until_delivered(d, receiver, http, "idle")
        filler.unlink()

        stored = await ready_again_and_delivered(d, receiver, http, "once the disk has room")
        assert [i["delivery"]["status"] for i in stored] == ["confirmed", "confirmed"]
    text = check_log(d)
    assert text.count("cannot write (database or disk is full)") == 1
    assert "writable again" in text


async def test_a_disk_gone_read_only_mid_run_is_survived(
    tmp_path: Path, receiver: FakeWebhookScheduler, http: aiohttp.ClientSession
) -> None:
    # The kernel refuses a read-only remount under open files (EBUSY), so the
    # fault is injected at the storage layer: SQLite's own read-only answer.
    flag = tmp_path / "read-only"
    d = Daemon(tmp_path, receiver.url, tmp_path / "outbox.sqlite3", readonly_flag=flag)
    async with running(d, http):
        flag.touch()
        await heat_until_delivered(d, receiver, http, "drained")

        async def refused() -> bool:
            ok, problems = await ready(http, d)
            return not ok and any("readonly" in p for p in problems)

        await wait_for_result(refused, bool, timeout=20.0, what="/readyz names the read-only disk")
        flag.unlink()
        await heat_until_delivered(d, receiver, http, "idle")

        stored = await ready_again_and_delivered(d, receiver, http, "once writable")
        assert [i["delivery"]["status"] for i in stored] == ["confirmed", "confirmed"]
    text = check_log(d)
    assert text.count("cannot write (attempt to write a readonly database)") == 1


def _loop_image(tmp_path: Path) -> Path | None:
    if shutil.which("mkfs.ext4") is None or shutil.which("fsfreeze") is None:
        return None
    image = tmp_path / "ext4.img"
    with image.open("wb") as fh:
        fh.truncate(16 * 2**20)
    made = subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], capture_output=True, check=False)
    return image if made.returncode == 0 else None


@needs_namespace
async def test_a_frozen_disk_delays_decisions_not_the_api_or_polling(
    tmp_path: Path, receiver: FakeWebhookScheduler, http: aiohttp.ClientSession
) -> None:
    image = _loop_image(tmp_path)
    if image is None:
        pytest.skip("no mkfs.ext4/fsfreeze here")
    disk = tmp_path / "disk"
    disk.mkdir()
    d = Daemon(
        tmp_path, receiver.url, disk / "outbox.sqlite3", mount=f"mount -o loop {image} {disk}"
    )
    d.start()
    try:

        async def up() -> bool:
            assert d.alive(), d.log_text()[-4000:]
            return (await ready(http, d))[0]

        with contextlib.suppress(AssertionError):
            await wait_for_result(up, bool, timeout=20.0, what="daemon ready")
        if not d.alive() and "mount" in d.log_text():
            pytest.skip(f"no loop device here: {d.log_text()[-300:]}")
        try:
            d.in_namespace("fsfreeze", "-f", str(disk))
        except subprocess.CalledProcessError:
            pytest.skip("fsfreeze refused here")
        try:
            d.set_temperature(HOT_C)

            async def stalled() -> bool:
                ok, problems = await ready(http, d)
                return not ok and any("waited" in p for p in problems)

            await wait_for_result(
                stalled, bool, timeout=20.0, what="/readyz reports the stalled write"
            )

            async def logged() -> bool:
                return "disk stalled?" in d.log_text()

            await wait_for_result(logged, bool, timeout=20.0, what="one ERROR line about the stall")
            # Meanwhile the loop serves and polls: fresh readings, an answering API.
            status, _ = await get(http, f"{d.base}/v1/state")
            assert status == 200
            assert receiver.node_state.get("gpu-node-07") != "drained"  # not sent before stored
            assert await metric(http, d, "rackguard_source_up") >= 1
            # A read queued behind the frozen write gives up with a 503, not a hang.
            status, body = await get(http, f"{d.base}/v1/decisions", timeout_s=10)
            assert status == 503 and "busy" in body["error"]["message"]
        finally:
            d.in_namespace("fsfreeze", "-u", str(disk))
        await heat_until_delivered(d, receiver, http, "drained")

        await ready_again_and_delivered(d, receiver, http, "once thawed")
    finally:
        if d.alive():
            d.in_namespace("fsfreeze", "-u", str(disk), check=False)
        d.stop()
    assert "disk stalled?" in check_log(d)


@pytest.mark.parametrize("content", [b"", b"\x00garbage, not a database\n" * 300])
async def test_a_zero_byte_or_corrupt_outbox_starts_fresh_with_a_warning(
    tmp_path: Path, receiver: FakeWebhookScheduler, http: aiohttp.ClientSession, content: bytes
) -> None:
    outbox = tmp_path / "outbox.sqlite3"
    outbox.write_bytes(content)
    d = Daemon(tmp_path, receiver.url, outbox)
    async with running(d, http):
        await heat_until_delivered(d, receiver, http, "drained")
    text = check_log(d)
    assert f"outbox: {outbox}" in text  # the start-up log names the path
    if content:
        (moved,) = list(tmp_path.glob("outbox.sqlite3.corrupt-*"))  # noqa: ASYNC240
        assert moved.read_bytes() == content and "moved to" in text
    else:
        assert "held no outbox" in text
    assert "WARNING" in text


# ---------------------------------------------------------------------- the receiver


async def test_a_401_is_retried_reported_and_delivered_once_fixed(
    tmp_path: Path, receiver: FakeWebhookScheduler, http: aiohttp.ClientSession
) -> None:
    d = Daemon(tmp_path, receiver.url, tmp_path / "outbox.sqlite3")
    async with running(d, http):
        receiver.fail_next, receiver.fail_status = 10**6, 401  # a rotated key
        d.set_temperature(HOT_C)

        async def refused() -> bool:
            ok, problems = await ready(http, d)
            return not ok and any("refused" in p and "auth" in p for p in problems)

        await wait_for_result(refused, bool, timeout=20.0, what="/readyz degraded by the refusal")
        _, backlog = await get(http, f"{d.base}/v1/outbox")
        assert backlog["pending"] == 1 and "HTTP 401" in backlog["items"][0]["last_error"]
        assert "auth" in backlog["refusal"]
        assert await metric(http, d, 'rackguard_delivery_failures_total{reason="auth"}') >= 1
        receiver.fail_next = 0  # the operator fixed the key

        async def delivered() -> bool:
            return receiver.node_state.get("gpu-node-07") == "drained"

        await wait_for_result(
            delivered, bool, timeout=20.0, what="the drain delivered once the key is fixed"
        )

        await ready_again_and_delivered(d, receiver, http, "")
    text = check_log(d)
    assert text.count("an operator must fix this") == 1
    assert "accepting deliveries again" in text


async def test_a_deduplicating_receiver_gets_every_new_decision_across_restarts(
    tmp_path: Path, receiver: FakeWebhookScheduler, http: aiohttp.ClientSession
) -> None:
    outbox = tmp_path / "outbox.sqlite3"
    d = Daemon(tmp_path, receiver.url, outbox)
    async with running(d, http):
        await heat_until_delivered(d, receiver, http, "drained")
        await heat_until_delivered(d, receiver, http, "idle")
    # The restarted policy counts its epochs from the start again.
    d2 = Daemon(tmp_path, receiver.url, outbox)
    async with running(d2, http):
        await heat_until_delivered(d2, receiver, http, "drained")
        stored = await decisions(http, d2)
    keys = [i["decision"]["key"] for i in stored]
    assert len(keys) == len(set(keys)) == 3
    delivered_once_in_effect(receiver, keys)
    assert [r.payload["action"] for r in receiver.received] == ["drain", "resume", "drain"]
    check_log(d2)


@dataclass
class OddReceiver:
    """A receiver that hangs, or answers 503 with a huge body, until ``healthy``."""

    mode: str  # "hang" or "huge"
    inner: FakeWebhookScheduler
    healthy: bool = False
    odd_answers: int = 0
    runner: web.AppRunner | None = None
    url: str = ""
    release: asyncio.Event = field(default_factory=asyncio.Event)  # ends the hanging answers

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if self.healthy:
            return await self.inner._handle(request)
        self.odd_answers += 1
        if self.mode == "hang":
            await self.release.wait()
            return web.Response(status=503)
        resp = web.StreamResponse(status=503)
        resp.content_length = 400 * 2**20
        await resp.prepare(request)
        chunk = b"x" * 2**20
        with contextlib.suppress(ConnectionError, RuntimeError):
            for _ in range(400):  # 400 MiB, unless the client hangs up first
                await resp.write(chunk)
        return resp

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/rackguard", self.handle)
        self.runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}/rackguard"

    async def stop(self) -> None:
        self.release.set()
        if self.runner is not None:
            await self.runner.cleanup()


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


@pytest.mark.parametrize("mode", ["hang", "huge"])
async def test_a_hanging_or_flooding_receiver_delays_but_never_drops(
    tmp_path: Path, http: aiohttp.ClientSession, mode: str
) -> None:
    inner = FakeWebhookScheduler(WEBHOOK_SECRET)
    odd = OddReceiver(mode, inner)
    await odd.start()
    try:
        d = Daemon(tmp_path, odd.url, tmp_path / "outbox.sqlite3")
        async with running(d, http):
            d.set_temperature(HOT_C)

            async def tried_twice() -> bool:
                return odd.odd_answers >= 2

            await wait_for_result(
                tried_twice,
                bool,
                timeout=20.0,
                what="two deliveries tried against the odd receiver",
            )
            status, _ = await get(http, f"{d.base}/healthz")  # the API answers meanwhile
            assert status == 200
            _, backlog = await get(http, f"{d.base}/v1/outbox")
            assert backlog["pending"] == 1
            error = backlog["items"][0]["last_error"]
            assert ("Timeout" in error) if mode == "hang" else ("HTTP 503" in error)
            assert len(error) < 1000
            assert d.proc is not None and _peak_rss_mb(d.proc.pid) < 200
            odd.healthy = True

            async def delivered() -> bool:
                return inner.node_state.get("gpu-node-07") == "drained"

            await wait_for_result(
                delivered, bool, timeout=20.0, what="delivered once the receiver is healthy"
            )
            stored = await decisions(http, d)
            delivered_once_in_effect(inner, [i["decision"]["key"] for i in stored])
        check_log(d)
    finally:
        await odd.stop()
