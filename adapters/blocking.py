"""Run a blocking library (NVML) on one dedicated daemon thread, never on the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import queue
import threading
from collections.abc import Callable
from typing import ParamSpec, TypeVar, cast

from adapters.errors import SourceUnavailable

P = ParamSpec("P")
T = TypeVar("T")

# One unit of work: the call, the loop to report to, and the future to settle.
_Job = tuple[Callable[[], object], asyncio.AbstractEventLoop, "asyncio.Future[object]"]


def _settle(fut: asyncio.Future[object], result: object, exc: BaseException | None) -> None:
    """Deliver an outcome on the loop thread, unless the waiter gave up."""
    if fut.done():  # cancelled: the caller timed out and abandoned the call
        return
    if exc is None:
        fut.set_result(result)
    elif isinstance(exc, StopIteration):  # a Future refuses StopIteration
        fut.set_exception(RuntimeError(f"blocking call raised {exc!r}"))
    else:
        fut.set_exception(exc)


def _work(jobs: queue.SimpleQueue[_Job | None], busy: threading.Lock) -> None:
    """Worker loop: run jobs one at a time until the None sentinel arrives."""
    while (job := jobs.get()) is not None:
        fn, loop, fut = job
        result: object = None
        error: BaseException | None = None
        try:
            result = fn()
        except BaseException as exc:  # forwarded to the awaiting coroutine, never lost
            error = exc
        finally:
            # Free before reporting, so the awaiting coroutine may call again at once.
            busy.release()
        with contextlib.suppress(RuntimeError):  # loop closed: nobody is waiting any more
            loop.call_soon_threadsafe(_settle, fut, result, error)


class DedicatedThread:
    """Runs blocking calls one at a time on one daemon thread; never queues behind a hung call.

    A call whose awaiting coroutine is cancelled (e.g. by ``asyncio.timeout``) is
    abandoned: the thread finishes it eventually, and until then every new call
    raises SourceUnavailable at once. After close() the next call starts a fresh
    thread, but only once the old thread's call has finished, so a hung library
    never costs more than one thread.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._busy = threading.Lock()  # held from submit until the call returns
        self._jobs: queue.SimpleQueue[_Job | None] | None = None
        self._thread: threading.Thread | None = None

    @property
    def busy(self) -> bool:
        """True while a call (perhaps abandoned) is still running on the thread."""
        return self._busy.locked()

    @property
    def ident(self) -> int | None:
        """The worker thread's id, or None before the first call and after close()."""
        return None if self._thread is None else self._thread.ident

    async def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn(*args, **kwargs)`` on the thread; SourceUnavailable if one is still running."""
        if not self._busy.acquire(blocking=False):
            raise SourceUnavailable(
                f"{self.name}: previous call still running (hung or timed out); not queueing"
            )
        try:
            loop = asyncio.get_running_loop()
            fut: asyncio.Future[object] = loop.create_future()
            self._start().put((functools.partial(fn, *args, **kwargs), loop, fut))
        except BaseException:
            self._busy.release()
            raise
        return cast(T, await fut)  # settled with fn's own result

    def close(self) -> None:
        """Let the thread exit after its current call; does not wait for a hung call."""
        if self._jobs is not None:
            self._jobs.put(None)
        self._jobs = None
        self._thread = None

    def _start(self) -> queue.SimpleQueue[_Job | None]:
        """The running worker's queue, starting the worker if there is none."""
        if self._jobs is None:
            jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
            thread = threading.Thread(
                target=_work, args=(jobs, self._busy), name=self.name, daemon=True
            )
            thread.start()
            self._jobs, self._thread = jobs, thread
        return self._jobs
