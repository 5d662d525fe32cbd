"""Headroom at full load: a GPU's thermal resistance to its coolant (or inlet air), online.

At steady state a GPU sits at ``T = T_ref + R * P``: ``T_ref`` the coolant supply
(liquid-cooled) or its inlet air, ``P`` its power, ``R`` the resistance of its
cold plate, paste and coolant path. ``R = (T - T_ref) / P`` is sampled once per
bucket while the GPU is steady (no load step over the settle time, no fast
heating), kept over a bounded window, and summarised robustly: the median, with
rank-based bounds at the policy's confidence (the order statistics of a
binomial sign test), so one odd bucket cannot move it. An idle GPU's resistance
projects what a job landing on it would meet: ``T_ref + R * P_limit``.

Out of steady state the heat balance is ``T - T_ref = R * (P - C * dT/dt)``: a
GPU cooling at its present power reads *above* its steady temperature, so its
ratio is an upper bound on ``R`` now (loose by ``R * C * |dT/dt|``: degrees at a
rate the readings resolve). Such a bound caps every kept sample (:meth:`cap`):
after a repair (a cold plate reseated, a pump restored) the samples of the old
plate are contradicted by what the GPU shows at once, and the estimate follows
the GPU down as it settles instead of waiting for new steady buckets to outvote
the old ones.

Pure: samples in, numbers out.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from math import isfinite
from typing import Final

import msgspec


class Resistance(msgspec.Struct, frozen=True, gc=False):
    """A thermal resistance estimate in K/W: median with its lower and upper bounds.

    A Struct (numbers only, as a Bucket): one is built each time the estimate moves.
    """

    median: float
    lo: float
    hi: float
    n: int


@dataclass(slots=True, eq=False)
class ResistanceEstimator:
    """``(T - T_ref) / P`` per steady bucket over the last ``keep`` buckets."""

    bucket_s: float
    keep: int
    z: float  # the bounds' normal quantile
    samples: deque[float] = field(init=False)
    _bucket: int | None = field(default=None, init=False)
    # Sum of ratios and their count over the open bucket (every sample steady).
    _sum: list[float] = field(init=False, default_factory=lambda: [0.0, 0.0])
    _taken: int = field(default=0, init=False)  # samples appended or capped: the version
    _estimate: tuple[int, int, Resistance | None] | None = field(default=None, init=False)
    _high: float | None = field(default=None, init=False)  # max(samples) once asked

    def __post_init__(self) -> None:
        self.samples = deque(maxlen=self.keep)

    def add(self, t: float, delta_t: float, power: float, steady: bool) -> None:
        """One sample; a bucket counts only if every one of its samples was steady."""
        if not (isfinite(t) and isfinite(delta_t) and isfinite(power)):
            return
        index = math.floor(t / self.bucket_s)
        if index != self._bucket:
            self._close()
            self._bucket = index
        if not steady or power <= 0.0 or delta_t <= 0.0:
            self._sum = [math.nan, 0.0]  # poisoned: the bucket is not steady
            return
        self._sum[0] += delta_t / power
        self._sum[1] += 1.0

    @property
    def highest(self) -> float:
        """The highest sample kept (-inf when none)."""
        # Asked at every temperature sample; the samples change once a bucket at most.
        high = self._high
        if high is None:
            high = self._high = max(self.samples, default=-math.inf)
        return high

    def capped_by(self, bound: float) -> bool:
        """Whether :meth:`cap` with ``bound`` would change the samples."""
        return isfinite(bound) and self.highest > bound

    def cap(self, bound: float) -> None:
        """The resistance is at most ``bound`` now: samples above it are of another plate."""
        if self.capped_by(bound):
            capped = [min(x, bound) for x in self.samples]
            self.samples.clear()
            self.samples.extend(capped)
            self._high = None
            self._taken += 1  # the samples changed: the cached estimate is stale

    def _close(self) -> None:
        total, n = self._sum
        if n > 0 and isfinite(total):
            self.samples.append(total / n)
            self._high = None
            self._taken += 1
        self._sum = [0.0, 0.0]

    def estimate(self, min_points: int) -> Resistance | None:
        """The median and its bounds; None under ``min_points`` steady buckets."""
        # Asked at every evaluation; the samples change once a bucket at most.
        last = self._estimate
        if last is not None and last[0] == min_points and last[1] == self._taken:
            return last[2]
        est = self._estimate_now(min_points)
        self._estimate = (min_points, self._taken, est)
        return est

    def _estimate_now(self, min_points: int) -> Resistance | None:
        n = len(self.samples)
        if n < max(3, min_points):
            return None
        ordered = sorted(self.samples)
        mid = n // 2
        median = ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2.0
        # Sign-test bounds of a median: ranks n/2 -+ z * sqrt(n) / 2.
        half = self.z * math.sqrt(n) / 2.0
        lo_i = max(0, math.floor(n / 2.0 - half) - 1)
        hi_i = min(n - 1, math.ceil(n / 2.0 + half))
        return Resistance(median, ordered[lo_i], ordered[hi_i], n)


class NodeHeadroom(msgspec.Struct, frozen=True, gc=False):
    """A node's headroom at full load: the least margin to slowdown any of its GPUs would
    have at its enforced power limit (the conservative bound of its resistance), in C.

    ``trusted`` only when every GPU of the node is read and has an estimate: the minimum
    over some GPUs is no bound for the node. A Struct (numbers only, as a Resistance):
    one is built per node at every evaluation.
    """

    margin_c: float | None = None
    trusted: bool = False
    estimated: int = 0  # GPUs with an estimate
    gpus: int = 0  # GPUs seen

    @classmethod
    def of(cls, margins: list[float | None]) -> NodeHeadroom:
        """From each GPU's full-load margin (None: not read, or no estimate yet)."""
        known = [m for m in margins if m is not None]
        return cls(
            min(known) if known else None,
            bool(margins) and len(known) == len(margins),
            len(known),
            len(margins),
        )


NO_HEADROOM: Final = NodeHeadroom()  # no GPU seen (one shared value: it is immutable)
