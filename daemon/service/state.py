"""The latest reading of every series, as the policy and the API see it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from policies.model import Reading


class StateStore:
    """Latest reading per series key; bounded by the number of series, not by time."""

    def __init__(self) -> None:
        self._latest: dict[str, Reading] = {}
        self._sources: dict[str, float] = {}
        self.generation = 0  # bumped by every update, for caches of derived views
        self._replace: set[str] = set()

    def update(self, source: str, readings: Sequence[Reading]) -> None:
        """Record one successful poll of ``source``."""
        self.generation += 1
        latest = self._latest
        for r in readings:
            latest[r.key] = r
        if readings:
            self._sources[source] = readings[-1].mono
            if source in self._replace:
                self._replace.discard(source)
                self._drop(source, keep={r.key for r in readings})

    def drop_source(self, source: str) -> None:
        """Forget every series of a source (removed by a reload)."""
        self._drop(source, keep=set())
        self._sources.pop(source, None)
        self._replace.discard(source)

    def replace_on_next_update(self, source: str) -> None:
        """Keep a source's series until its next poll, then drop those it no longer reports.

        For a source reconfigured by a reload: state is kept, and a GPU or probe
        taken out of its config does not linger as a stale series.
        """
        self._replace.add(source)

    def _drop(self, source: str, keep: set[str]) -> None:
        prefix = f"{source}/"
        for key in [k for k in self._latest if k.startswith(prefix) and k not in keep]:
            del self._latest[key]
        self.generation += 1

    def latest(self) -> Mapping[str, Reading]:
        """Every series' latest reading (read-only view)."""
        return self._latest

    def readings(self) -> Iterable[Reading]:
        """Every series' latest reading."""
        return self._latest.values()

    def reported(self, source: str) -> bool:
        """Whether ``source`` has delivered readings at least once."""
        return source in self._sources
