"""The running source runners: started in the service's TaskGroup, swapped by a reload."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from daemon.loops import run_in
from daemon.service.runner import SourceRunner
from daemon.service.state import StateStore

log = logging.getLogger(__name__)


class SourceSet:
    """Owns the runners and their tasks; readers get the list, never the tasks."""

    def __init__(self, store: StateStore) -> None:
        self.runners: list[SourceRunner] = []
        self._store = store
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._tg: asyncio.TaskGroup | None = None
        # Runners someone else runs (the rack leader's shared sources): never started here.
        self.skip: Callable[[SourceRunner], bool] = lambda runner: False

    def start(self, tg: asyncio.TaskGroup) -> None:
        """Start every runner in ``tg``; later swaps start theirs there too."""
        self._tg = tg
        for runner in self.runners:
            self._start(runner)

    def detach(self) -> None:
        """The TaskGroup has ended."""
        self._tg = None

    def _start(self, runner: SourceRunner) -> None:
        if self._tg is not None and not self.skip(runner):
            self._tasks[runner.name] = run_in(
                self._tg,
                f"source:{runner.name}",
                runner.run,
                what=f"{runner.name}: source runner",
                restart_s=runner.timing.interval_s,
            )

    async def swap(
        self, stop: set[str], keep_series: set[str], fresh: Iterable[SourceRunner]
    ) -> None:
        """Stop the runners named in ``stop``, then start ``fresh`` ones.

        A stopped source's series are dropped, unless it is in ``keep_series``
        (replaced: its new runner's first update replaces them).
        """
        for runner in [r for r in self.runners if r.name in stop]:
            task = self._tasks.pop(runner.name, None)
            if task is not None:
                task.cancel()
                # wait() rather than await: a cancellation of this reload itself
                # (shutdown) must propagate, not be swallowed with the runner's.
                await asyncio.wait([task])
            runner.first_attempt.set()  # readiness no longer waits on a replaced runner
            self.runners.remove(runner)
            if runner.name in keep_series:
                self._store.replace_on_next_update(runner.name)
            else:
                self._store.drop_source(runner.name)  # removed: its series would only go stale
            log.info("%s: source stopped for reload", runner.name)
        for runner in fresh:
            self.runners.append(runner)
            self._start(runner)
            log.info("%s: source (re)started by reload", runner.name)
