"""Raw samples of the last few seconds or minutes: a GPU's temperatures and power.

Times must increase (a sample at or before the newest is ignored); older samples
than the kept span are dropped as new ones come. :class:`RecentSamples` also keeps
their range in O(1); :class:`TimedValues` keeps them as two lists, for windows
found by bisection and read as slices.
"""

from __future__ import annotations

from collections import deque
from itertools import takewhile
from math import isfinite


class RecentSamples:
    """The (t, value) samples of the last ``keep_s`` seconds, and their range in O(1).

    Times must increase (a sample at or before the newest is ignored). The range comes
    from sliding-window maximum and minimum deques: asked at every temperature sample,
    scanning two minutes of power samples each time dominated a replay. Samples kept
    without ``ranged`` have no range (the deques are not kept).
    """

    __slots__ = ("_highs", "_lows", "_ranged", "added", "ordered", "samples")

    def __init__(self, *, ranged: bool = True) -> None:
        self.samples: deque[tuple[float, float]] = deque()
        self.added = 0  # samples taken so far: a version number for cached results
        # Times strictly increasing, as they are unless a non-finite one was ever taken
        # (NaN compares false with the newest, so it is not refused like a repeat).
        self.ordered = True
        self._ranged = ranged
        # Candidates for the window's max (values decreasing) and min (increasing).
        self._highs: deque[tuple[float, float]] = deque()
        self._lows: deque[tuple[float, float]] = deque()

    def add(self, t: float, value: float, keep_s: float) -> None:
        """One sample; those older than ``keep_s`` before it are dropped."""
        samples = self.samples
        if samples and t <= samples[-1][0]:
            return
        if not isfinite(t):
            self.ordered = False
        sample = (t, value)
        samples.append(sample)
        self.added += 1
        cutoff = t - keep_s
        while samples[0][0] < cutoff:
            samples.popleft()
        if not self._ranged:
            return
        highs, lows = self._highs, self._lows
        while highs and highs[-1][1] <= value:
            highs.pop()
        highs.append(sample)
        while lows and lows[-1][1] >= value:
            lows.pop()
        lows.append(sample)
        while highs[0][0] < cutoff:
            highs.popleft()
        while lows[0][0] < cutoff:
            lows.popleft()

    def spread(self) -> float:
        """The highest minus the lowest value kept (0.0 when none)."""
        if not self.samples:
            return 0.0
        if not self._ranged:
            raise ValueError("these samples are kept without their range")
        return self._highs[0][1] - self._lows[0][1]

    @property
    def count(self) -> int:
        """Samples kept."""
        return len(self.samples)

    def values_since(self, since: float) -> list[float]:
        """The values of the newest samples back to the first older than ``since``, newest first."""
        return [v for _, v in takewhile(lambda x: x[0] >= since, reversed(self.samples))]


class TimedValues:
    """The (t, value) samples of the last ``keep_s`` seconds, as two parallel lists.

    Times must increase (a sample at or before the newest is ignored). Kept as plain
    lists from ``head`` on, so windows are found by bisection on the times and read
    as slices: the confirm windows are asked for at every temperature sample.
    """

    __slots__ = ("added", "head", "ordered", "times", "values")

    _COMPACT = 256  # dropped samples kept before the lists are shortened

    def __init__(self) -> None:
        self.times: list[float] = []
        self.values: list[float] = []
        self.head = 0  # the oldest sample kept
        self.added = 0  # samples taken so far: a version number for cached results
        # Times strictly increasing, as they are unless a non-finite one was ever taken
        # (NaN compares false with the newest, so it is not refused like a repeat).
        self.ordered = True

    def add(self, t: float, value: float, keep_s: float) -> None:
        """One sample; those older than ``keep_s`` before it are dropped."""
        times = self.times
        if len(times) > self.head and t <= times[-1]:
            return
        if not isfinite(t):
            self.ordered = False
        times.append(t)
        self.values.append(value)
        self.added += 1
        cutoff = t - keep_s
        head = self.head
        while times[head] < cutoff:
            head += 1
        if head >= self._COMPACT:
            del times[:head]
            del self.values[:head]
            head = 0
        self.head = head

    @property
    def first(self) -> int:
        """The sequence number (in every sample taken) of ``times[0]``."""
        return self.added - len(self.times)

    @property
    def samples(self) -> list[tuple[float, float]]:
        """The samples kept, oldest first."""
        head = self.head
        return list(zip(self.times[head:], self.values[head:], strict=True))
