"""The one capped exponential backoff used for polling sources and for deliveries."""

from __future__ import annotations


def capped_backoff(initial_s: float, max_s: float, failures: int) -> float:
    """initial, 2x, 4x ... after ``failures`` (>= 1) failures in a row, never above ``max_s``.

    Callers add their own jitter.
    """
    return min(max_s, initial_s * 2.0 ** min(max(failures, 1) - 1, 30))
