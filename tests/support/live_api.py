"""A real daemon serving its API on loopback from a thread of its own, for blocking clients.

An independent client (schemathesis, on requests) blocks while it waits for an
answer, so the daemon cannot share its event loop: it runs on its own loop in a
thread, with a token set (overrides enabled), for as long as the context lasts.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from fakes.nvml import fake_node
from fakes.scheduler import FakeWebhookScheduler
from tests.support.daemon_harness import running_daemon
from tests.support.secrets import WEBHOOK_SECRET, write_secret

# An event stream lasts as long as its client likes; a client that reads it to the
# end (as a conformance tester does) would wait forever. Ending every open stream
# this often, as a restart of the daemon would, gives each answer an end.
STREAM_END_S = 0.2


@dataclass(frozen=True)
class LiveApi:
    """Where the daemon answers, and its token."""

    base: str
    token: str


@contextlib.contextmanager
def live_api(tmp: Path, token: str, api_extra: str = "") -> Iterator[LiveApi]:
    """A daemon on the fake node with ``[api] token_file`` holding ``token``."""
    secret, token_file = tmp / "webhook.key", tmp / "api.token"
    write_secret(secret, "s3cret-key\n")
    write_secret(token_file, token + "\n")
    extra = f'token_file = "{token_file}"\n{api_extra}'
    loop = asyncio.new_event_loop()
    ready: list[str] = []
    started, stop = threading.Event(), asyncio.Event()
    failed: list[BaseException] = []

    async def serve() -> None:
        receiver = FakeWebhookScheduler(WEBHOOK_SECRET)
        await receiver.start()
        try:
            async with running_daemon(fake_node(), receiver, secret, api_extra=extra) as d:
                ready.append(f"http://127.0.0.1:{d.api_port}")
                started.set()
                while not stop.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), STREAM_END_S)
                    d.events.close()
        finally:
            await receiver.stop()

    def run() -> None:
        try:
            loop.run_until_complete(serve())
        except BaseException as err:  # reported by the test's thread
            failed.append(err)
        finally:
            started.set()
            loop.close()

    thread = threading.Thread(target=run, name="live-api", daemon=True)
    thread.start()
    started.wait(30)
    try:
        if failed or not ready:
            raise RuntimeError(f"the daemon did not start: {failed}")
        yield LiveApi(ready[0], token)
    finally:
        if not loop.is_closed():
            loop.call_soon_threadsafe(stop.set)
        thread.join(30)
        if failed:
            raise failed[0]
