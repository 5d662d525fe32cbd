"""The source runner: timeout, backoff, overrun skip, health transitions, isolation.

The runner schedules on the event loop's clock; these tests run on a virtual one
(tests/support/virtual_time.py), so the schedule is exact and the same on any
machine, and a minute of it takes no time.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Sequence

import pytest

from adapters.errors import SourceSetupError, SourceUnavailable
from daemon.config.sources import SourceTiming
from daemon.service.runner import Health, SourceRunner
from daemon.service.source_set import SourceSet
from daemon.service.state import StateStore
from policies.model import Quality, Reading, SensorKind
from tests.support.stray_cancel import CancelledWithResult
from tests.support.virtual_time import virtual_time


def reading(source: str, value: float) -> Reading:
    return Reading(
        source,
        "s.temp",
        SensorKind.GPU_TEMPERATURE,
        value,
        "celsius",
        Quality.GOOD,
        time.monotonic(),
        time.time(),
    )


class ScriptedAdapter:
    """An adapter whose behaviour per read is scripted: a value, an error, or a delay."""

    def __init__(self, name: str, script: Sequence[object] = (), *, default: object = 1.0) -> None:
        self.name = name
        self.script = list(script)
        self.default = default
        self.reads: list[float] = []
        self.connects = 0
        self.closes = 0

    async def connect(self) -> None:
        self.connects += 1

    async def read(self) -> Sequence[Reading]:
        self.reads.append(asyncio.get_running_loop().time())
        step = self.script.pop(0) if self.script else self.default
        if isinstance(step, BaseException):
            raise step
        if isinstance(step, tuple):  # ("sleep", seconds)
            await asyncio.sleep(step[1])
            return [reading(self.name, 1.0)]
        assert isinstance(step, float)
        return [reading(self.name, step)]

    async def close(self) -> None:
        self.closes += 1


def timing(interval: float = 0.05, timeout: float = 0.03, **kw: float) -> SourceTiming:
    return SourceTiming(
        interval_s=interval,
        timeout_s=timeout,
        backoff_initial_s=kw.get("backoff_initial_s", 0.05),
        backoff_max_s=kw.get("backoff_max_s", 0.2),
        down_after=int(kw.get("down_after", 3)),
    )


async def run_for(runners: Sequence[SourceRunner], seconds: float) -> None:
    tasks = [asyncio.create_task(r.run()) for r in runners]
    await asyncio.sleep(seconds)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@virtual_time
async def test_polls_on_interval_and_delivers_readings() -> None:
    got: list[tuple[str, int]] = []
    adapter = ScriptedAdapter("a")
    runner = SourceRunner(
        adapter, timing(0.05), lambda s, rs: got.append((s, len(rs))), rng=random.Random(1)
    )
    await run_for([runner], 0.5)
    assert len(adapter.reads) == 10, adapter.reads  # a random start in the first interval
    gaps = [b - a for a, b in zip(adapter.reads, adapter.reads[1:], strict=False)]
    assert gaps == pytest.approx([0.05] * 9), gaps
    assert got[0] == ("a", 1)
    assert runner.health.value == "up"
    assert adapter.connects == 1  # connected once, reused
    assert adapter.closes == 1  # closed on cancel


@virtual_time
async def test_start_offset_is_random_within_interval() -> None:
    firsts = []
    for seed in range(4):
        adapter = ScriptedAdapter("a")
        runner = SourceRunner(
            adapter, timing(0.2, 0.1), lambda s, rs: None, rng=random.Random(seed)
        )
        t0 = asyncio.get_running_loop().time()
        await run_for([runner], 0.25)
        firsts.append(adapter.reads[0] - t0)
    assert all(0 <= f <= 0.22 for f in firsts)
    assert max(firsts) - min(firsts) > 0.02  # not all at the same instant


@virtual_time
async def test_timeout_marks_failure_and_health_transitions(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="daemon.service.runner")
    hang = ("sleep", 10.0)
    adapter = ScriptedAdapter("slow", [hang, hang, hang, hang, 1.0])
    runner = SourceRunner(
        adapter,
        timing(0.05, 0.03, backoff_initial_s=0.02, backoff_max_s=0.05),
        lambda s, rs: None,
        rng=random.Random(2),
    )
    states: list[Health] = []
    runner._on_attempt = lambda r, d: states.append(r.health)
    await run_for([runner], 0.6)
    assert states[:5] == [Health.DEGRADED, Health.DEGRADED, Health.DOWN, Health.DOWN, Health.UP]
    assert "timed out after 0.03s" in runner.stats.last_error
    assert adapter.connects == 5  # each failed session was rebuilt
    # Logged on transitions only: one warning, one error, one recovery.
    msgs = [
        (r.levelno, r.getMessage()) for r in caplog.records if r.name == "daemon.service.runner"
    ]
    assert sum(1 for lv, m in msgs if lv == logging.WARNING) == 1
    assert sum(1 for lv, m in msgs if lv == logging.ERROR) == 1
    assert sum(1 for lv, m in msgs if "recovered" in m) == 1


async def test_backoff_is_capped_exponential_with_jitter() -> None:
    runner = SourceRunner(
        ScriptedAdapter("x"),
        timing(1.0, 0.5, backoff_initial_s=1.0, backoff_max_s=16.0),
        lambda s, rs: None,
        rng=random.Random(3),
    )
    delays = [runner.backoff_s(n) for n in range(1, 9)]
    bases = [1, 2, 4, 8, 16, 16, 16, 16]
    for d, b in zip(delays, bases, strict=True):
        assert 0.8 * b <= d <= 1.2 * b
    assert len({round(d, 6) for d in delays[4:]}) > 1  # jittered, not constant


@virtual_time
async def test_failures_back_off_between_attempts() -> None:
    err = SourceUnavailable("no route")
    adapter = ScriptedAdapter("dead", default=err)
    runner = SourceRunner(
        adapter,
        timing(0.02, 0.01, backoff_initial_s=0.08, backoff_max_s=0.16),
        lambda s, rs: None,
        rng=random.Random(4),
    )
    await run_for([runner], 0.7)
    gaps = [b - a for a, b in zip(adapter.reads, adapter.reads[1:], strict=False)]
    assert gaps and all(g >= 0.06 for g in gaps), gaps  # never at the 20 ms interval
    assert runner.health is Health.DOWN
    assert len(adapter.reads) <= 8


@virtual_time
async def test_overrun_skips_ticks_instead_of_queueing() -> None:
    # Reads take 0.12 s on a 0.05 s interval (timeout 0.2 > interval on purpose).
    adapter = ScriptedAdapter("long", default=("sleep", 0.12))
    t = SourceTiming(0.05, 0.2, 0.05, 0.1, 3)
    runner = SourceRunner(adapter, t, lambda s, rs: None, rng=random.Random(5))
    await run_for([runner], 0.65)
    assert runner.stats.skipped_ticks >= 4
    gaps = [b - a for a, b in zip(adapter.reads, adapter.reads[1:], strict=False)]
    # Each attempt starts on the next grid tick after the last one ended (0.12 s
    # reads on a 0.05 s grid: every third tick), never back to back in a burst.
    assert gaps == pytest.approx([0.15] * len(gaps)) and len(gaps) >= 3, gaps
    assert runner.health.value == "up"


@virtual_time
async def test_hung_source_does_not_delay_others() -> None:
    hung = ScriptedAdapter("hung", default=("sleep", 3600.0))
    healthy = ScriptedAdapter("ok")
    runners = [
        SourceRunner(hung, timing(0.05, 0.04), lambda s, rs: None, rng=random.Random(6)),
        SourceRunner(healthy, timing(0.05, 0.04), lambda s, rs: None, rng=random.Random(7)),
    ]
    await run_for(runners, 0.5)
    gaps = [b - a for a, b in zip(healthy.reads, healthy.reads[1:], strict=False)]
    assert len(healthy.reads) >= 8
    assert max(gaps) < 0.09, gaps
    assert runners[0].health in (Health.DEGRADED, Health.DOWN)
    assert runners[1].health is Health.UP


async def test_setup_error_is_reported_not_raised() -> None:
    adapter = ScriptedAdapter("nv", [SourceSetupError("libnvidia-ml.so.1 not found")])
    runner = SourceRunner(adapter, timing(), lambda s, rs: None, rng=random.Random(8))
    assert await runner.attempt() is False
    assert runner.health is Health.DEGRADED
    assert "libnvidia-ml.so.1" in runner.stats.last_error
    assert runner.first_attempt.is_set()


async def test_unexpected_adapter_error_is_a_failed_poll_not_a_crash(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bug = ValueError("zip() argument 2 is shorter than argument 1")
    adapter = ScriptedAdapter("cdu", [bug, bug, 1.0])
    runner = SourceRunner(adapter, timing(), lambda s, rs: None, rng=random.Random(9))
    assert await runner.attempt() is False
    assert await runner.attempt() is False
    assert runner.health is Health.DEGRADED
    assert runner.stats.last_error == f"adapter error: ValueError: {bug}"
    tracebacks = [r for r in caplog.records if r.exc_info and r.name == "daemon.service.runner"]
    assert len(tracebacks) == 1  # logged once per failure streak, with the traceback
    assert await runner.attempt() is True
    assert runner.health.value == "up"


@virtual_time
async def test_a_runner_ended_by_a_cancellation_no_one_asked_for_is_restarted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = StateStore()
    adapter = ScriptedAdapter("cdu", [1.0, CancelledWithResult(), 2.0, 3.0])
    runner = SourceRunner(adapter, timing(0.05), store.update, rng=random.Random(3))
    sources = SourceSet(store)
    sources.runners.append(runner)

    async def serve() -> None:
        async with asyncio.TaskGroup() as tg:
            sources.start(tg)

    service = asyncio.create_task(serve())
    await asyncio.sleep(0.5)
    assert not service.done()
    assert adapter.script == [] and len(adapter.reads) >= 6  # read on past the stray cancel
    assert runner.health is Health.UP
    assert [r.value for r in store.readings()] == [1.0]  # the default after the script
    service.cancel()  # the daemon stopping: the runner is not restarted
    await asyncio.gather(service, return_exceptions=True)
    assert service.cancelled()
    assert adapter.closes == 2  # closed when it ended, and when stopped
    restarts = [r for r in caplog.records if "no one asked for" in r.getMessage()]
    assert len(restarts) == 1 and restarts[0].levelno == logging.ERROR


class StopRacingClose(ScriptedAdapter):
    """Its first close() (after a failed read) ends in the very turn a stop arrives."""

    def __init__(self) -> None:
        super().__init__("pdu", [SourceUnavailable("pdu: no answer")])
        self.stop: Callable[[], object] = lambda: None

    async def close(self) -> None:
        await super().close()
        if self.closes == 1:
            loop = asyncio.get_running_loop()
            # Two turns on: after close() is done, before its waiter has run on.
            loop.call_soon(loop.call_soon, self.stop)


@virtual_time
async def test_a_stop_as_a_failed_session_closes_is_not_lost() -> None:
    adapter = StopRacingClose()
    runner = SourceRunner(adapter, timing(0.05), lambda source, readings: None)
    task = asyncio.create_task(runner.run())
    adapter.stop = task.cancel
    await asyncio.sleep(1.0)
    # Before: wait_for (3.11) returned close()'s result and dropped the stop; the
    # runner polled on, and a reload or a stop waited for it forever.
    assert task.cancelled()
    assert len(adapter.reads) == 1 and adapter.closes == 2
