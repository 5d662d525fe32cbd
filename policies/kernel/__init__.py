"""The policy's numeric kernel: sample and slope stores, windows and their search.

What a replay spends most of its time in (every sample of every series passes
through here), kept apart from the policy's rules so that it can be read, tested
and measured on its own. The rest of the policy sees it through two protocols,
each with one implementation: :class:`SlopeStore` (a forecaster's sorted pairwise
slopes, :class:`~policies.kernel.slopes.SortedSlopes`) and
:class:`TemperatureWindows` (a GPU's two confirm windows,
:class:`~policies.kernel.windows.ConfirmWindows`).
"""

from __future__ import annotations

from typing import Protocol

from policies.kernel.buckets import Bucket
from policies.kernel.samples import TimedValues
from policies.kernel.windows import Spans, Values


class SlopeStore(Protocol):
    """The sorted pairwise slopes of a run of buckets that slides from call to call."""

    def sen(self, run: list[Bucket], z: float) -> tuple[float, float, float] | None:
        """The median slope of ``run`` and Sen's bounds at quantile ``z`` (None: too few)."""


class TemperatureWindows(Protocol):
    """A GPU's raw temperatures, read as two consecutive windows of width ``w`` before ``now``."""

    @property
    def recent(self) -> TimedValues:
        """The samples kept."""

    def add(self, t: float, value: float, keep_s: float) -> None:
        """One sample; those older than ``keep_s`` before it are dropped."""

    def spans(self, now: float, w: float) -> Spans | None:
        """The windows' places in ``recent`` (None: out of order, found by scanning)."""

    def slope(self, start: int, end: int) -> float | None:
        """The median pairwise slope of the samples ``start:end`` (None under 4)."""

    def beyond(self, start: int, end: int, limit: float) -> bool:
        """That slope's magnitude is over ``limit``."""

    def values_of(self, now: float, w: float, spans: Spans | None) -> Values:
        """The sorted values of the newer and the older window."""

    def rates(self, now: float, w: float) -> tuple[float, float] | None:
        """The newer and the older window's slope, (0, 0) within one reading step."""

    def fast(self, now: float, w: float, fastest: float) -> float | None:
        """The newer window's slope when both windows' are over ``fastest``."""
