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

    def update(self, source: str, readings: Sequence[Reading]) -> None:
        """Record one successful poll of ``source``."""
        self.generation += 1
        latest = self._latest
        for r in readings:
            latest[r.key] = r
        if readings:
            self._sources[source] = readings[-1].mono

    def latest(self) -> Mapping[str, Reading]:
        """Every series' latest reading (read-only view)."""
        return self._latest

    def readings(self) -> Iterable[Reading]:
        """Every series' latest reading."""
        return self._latest.values()

    def reported(self, source: str) -> bool:
        """Whether ``source`` has delivered readings at least once."""
        return source in self._sources
