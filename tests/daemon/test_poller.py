"""The one poller: grid, jitter, timeout, backoff, skipped ticks, health and log once.

Run on a virtual clock (tests/support/virtual_time.py): the times are exact.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
from collections.abc import Sequence

import pytest

from daemon.poller import Backoff, Health, Poller, capped_backoff
from tests.support.stray_cancel import reply_racing_the_cancel
from tests.support.virtual_time import virtual_time


class Script:
    """An update whose outcome per call is scripted: None (ok), an exception, or a delay."""

    def __init__(self, steps: Sequence[object] = ()) -> None:
        self.steps = list(steps)
        self.calls: list[float] = []

    async def __call__(self) -> None:
        self.calls.append(asyncio.get_running_loop().time())
        step = self.steps.pop(0) if self.steps else None
        if isinstance(step, BaseException):
            raise step
        if isinstance(step, float):
            await asyncio.sleep(step)


async def run_for(poller: Poller, seconds: float) -> None:
    task = asyncio.create_task(poller.run())
    await asyncio.sleep(seconds)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def gaps(times: Sequence[float]) -> list[float]:
    return [round(b - a, 6) for a, b in itertools.pairwise(times)]


@virtual_time
async def test_ticks_on_a_grid_from_now() -> None:
    update = Script([0.3])  # the first update takes 0.3 s: the grid does not move
    poller = Poller("p", update, interval_s=1.0)
    await run_for(poller, 3.5)
    assert update.calls == pytest.approx([0.0, 1.0, 2.0, 3.0])
    assert poller.health is Health.UP and poller.first_attempt.is_set()


@virtual_time
async def test_spread_start_is_random_within_one_interval() -> None:
    starts = []
    for seed in range(5):
        update = Script()
        await run_for(
            Poller("p", update, interval_s=10.0, spread_start=True, rng=random.Random(seed)), 10.0
        )
        starts.append(update.calls[0] - asyncio.get_running_loop().time() + 10.0)
    assert all(0.0 <= s < 10.0 for s in starts)
    assert len({round(s, 3) for s in starts}) == 5


@virtual_time
async def test_step_jitter_stays_within_its_fraction() -> None:
    update = Script()
    await run_for(
        Poller("p", update, interval_s=10.0, step_jitter=0.1, rng=random.Random(1)), 500.0
    )
    steps = gaps(update.calls)
    assert len(steps) >= 45
    assert all(9.0 <= s <= 11.0 for s in steps)
    assert len(set(steps)) > 10  # jittered, not fixed


@virtual_time
async def test_an_interval_function_is_read_after_every_attempt() -> None:
    interval = [1.0]
    update = Script()
    poller = Poller("p", update, interval_s=lambda: interval[0])
    task = asyncio.create_task(poller.run())
    await asyncio.sleep(2.5)
    interval[0] = 5.0  # a reload
    await asyncio.sleep(11.0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    # Read after each attempt: the step after t=2 was set at t=2, the new one from t=3.
    assert gaps(update.calls) == [1.0, 1.0, 1.0, 5.0, 5.0]


@virtual_time
async def test_overrun_skips_ticks_instead_of_queueing() -> None:
    update = Script([3.5])
    poller = Poller("p", update, interval_s=1.0)
    await run_for(poller, 6.5)
    assert update.calls == pytest.approx([0.0, 4.0, 5.0, 6.0])
    assert poller.stats.skipped_ticks == 3


@virtual_time
async def test_timeout_fails_the_attempt_and_backoff_is_capped() -> None:
    update = Script([10.0] * 6)
    poller = Poller(
        "p",
        update,
        interval_s=0.1,
        timeout_s=0.5,
        backoff=Backoff(1.0, 4.0, jitter=(1.0, 1.0)),
        down_after=3,
    )
    await run_for(poller, 30.0)
    # attempt k starts after the previous one's start + max(timeout, backoff(k)).
    assert gaps(update.calls[:6]) == pytest.approx([1.0, 2.0, 4.0, 4.0, 4.0], abs=0.11)
    assert poller.stats.last_error == "timed out after 0.5s"
    assert poller.stats.failures == 6 and poller.health is Health.UP
    assert poller.stats.consecutive_failures == 0


def test_backoff_doubles_to_its_cap_with_jitter_inside_the_band() -> None:
    assert [capped_backoff(0.5, 5.0, n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    assert capped_backoff(0.5, 5.0, 1000) == 5.0
    rng = random.Random(3)
    b = Backoff(1.0, 8.0)
    delays = [b.delay_s(3, rng) for _ in range(200)]
    assert all(3.2 <= d <= 4.8 for d in delays) and max(delays) - min(delays) > 1.0


@virtual_time
async def test_health_moves_are_reported_once_and_repeats_are_debug(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="daemon.poller")
    boom = OSError("no route")
    update = Script([boom, boom, boom, boom, None])
    changes: list[tuple[Health, Health, str]] = []
    poller = Poller(
        "p",
        update,
        interval_s=1.0,
        down_after=3,
        on_change=lambda old, new, why: changes.append((old, new, why)),
    )
    await run_for(poller, 5.5)
    assert changes == [
        (Health.STARTING, Health.DEGRADED, "no route"),
        (Health.DEGRADED, Health.DOWN, "no route"),
        (Health.DOWN, Health.UP, ""),
    ]
    repeats = [r for r in caplog.records if "failed again" in r.getMessage()]
    assert [r.levelno for r in repeats] == [logging.DEBUG, logging.DEBUG]
    assert poller.stats.attempts == 6 and poller.stats.failures == 4


@virtual_time
async def test_default_reporting_logs_warning_error_and_recovery(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="daemon.poller")
    update = Script([OSError("a"), OSError("b"), None])
    await run_for(Poller("feed", update, interval_s=1.0, down_after=2), 3.5)
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "feed: failed (now degraded): a"),
        (logging.ERROR, "feed: failed (now down): b"),
        (logging.INFO, "feed: recovered"),
    ]


@virtual_time
async def test_an_unexpected_exception_ends_the_poller() -> None:
    update = Script([KeyError("bug")])
    poller = Poller("p", update, interval_s=1.0, failures=(OSError,))
    with pytest.raises(KeyError):
        await poller.run()
    assert poller.stats.failures == 0


@virtual_time
async def test_a_failed_attempt_runs_the_cleanup_and_describes_the_error() -> None:
    cleaned: list[float] = []

    async def cleanup() -> None:
        cleaned.append(asyncio.get_running_loop().time())

    durations: list[float] = []
    poller = Poller(
        "p",
        Script([OSError(), None]),
        interval_s=1.0,
        describe=lambda err: f"described {type(err).__name__}",
        on_failure=cleanup,
        on_attempt=durations.append,
    )
    assert not await poller.attempt()
    assert poller.stats.last_error == "described OSError" and cleaned == [0.0]
    assert await poller.attempt()
    assert len(cleaned) == 1 and len(durations) == 2


@virtual_time
async def test_a_hung_update_does_not_delay_another_poller() -> None:
    hung, fine = Script([1000.0]), Script()
    a = Poller("hung", hung, interval_s=1.0, timeout_s=0.5, backoff=Backoff(60.0, 60.0))
    b = Poller("fine", fine, interval_s=1.0)
    tasks = [asyncio.create_task(p.run()) for p in (a, b)]
    await asyncio.sleep(10.5)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert len(fine.calls) == 11 and len(hung.calls) == 1
    assert a.health is Health.DOWN


@virtual_time
async def test_a_wake_brings_the_next_attempt_forward_and_restarts_the_grid() -> None:
    wake = asyncio.Event()
    update = Script()
    poller = Poller("p", update, interval_s=10.0, wake=wake)
    task = asyncio.create_task(poller.run())
    await asyncio.sleep(3.0)
    wake.set()  # a change seen at t=3
    await asyncio.sleep(0)
    assert not wake.is_set()  # taken by the attempt it caused
    await asyncio.sleep(20.5)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert update.calls == pytest.approx([0.0, 3.0, 13.0, 23.0])


@virtual_time
async def test_a_success_that_gives_nothing_of_use_is_degraded_once() -> None:
    why = ["no probe read"]
    changes: list[tuple[Health, Health, str]] = []
    poller = Poller(
        "p",
        Script(),
        interval_s=1.0,
        degraded=lambda: why[0],
        on_change=lambda old, new, w: changes.append((old, new, w)),
    )
    for _ in range(3):
        assert await poller.attempt()
    assert poller.health is Health.DEGRADED and poller.stats.last_error == "no probe read"
    why[0] = ""
    assert await poller.attempt()
    assert changes == [
        (Health.STARTING, Health.DEGRADED, "no probe read"),
        (Health.DEGRADED, Health.UP, ""),
    ]
    assert poller.stats.failures == 0


@virtual_time
async def test_a_library_cancellation_at_the_timeout_is_a_failed_attempt() -> None:
    calls: list[float] = []

    async def update() -> None:
        calls.append(asyncio.get_running_loop().time())
        if len(calls) == 1:
            await reply_racing_the_cancel()

    poller = Poller("cdu", update, interval_s=1.0, timeout_s=0.5, backoff=Backoff(1.0, 1.0))
    task = asyncio.create_task(poller.run())
    await asyncio.sleep(5.5)
    assert not task.done()  # before the fix the poller ended here, silently
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert poller.stats.failures == 1
    assert poller.stats.last_error == "timed out after 0.5s"
    assert len(calls) >= 5 and poller.health is Health.UP
