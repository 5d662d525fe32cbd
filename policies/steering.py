"""Steering new work to cool nodes: a node's headroom at full load as a bucket, with hysteresis.

``edges_c`` (ascending) cut the headroom into ``len(edges_c) + 1`` buckets: bucket
0 holds the least headroom (under ``edges_c[0]``), the last the most. A margin
moves to another bucket only once it is ``hysteresis_c`` past the edge between
them, so a margin oscillating around an edge does not rewrite the scheduler's
setting at every evaluation.

Pure: numbers in, a bucket out.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence


def bucket_of(margin_c: float, edges_c: Sequence[float]) -> int:
    """The bucket a margin falls in without hysteresis (an edge belongs to the bucket above)."""
    return bisect.bisect_right(edges_c, margin_c)


def steer_bucket(
    margin_c: float, edges_c: Sequence[float], current: int | None, hysteresis_c: float
) -> int:
    """The bucket for ``margin_c`` given the bucket in force (None: none yet)."""
    plain = bucket_of(margin_c, edges_c)
    if current is None or not 0 <= current <= len(edges_c) or plain == current:
        return plain
    if plain > current:
        # Up only once past the current bucket's upper edge by the hysteresis.
        return max(current, bucket_of(margin_c - hysteresis_c, edges_c))
    # Down only once under its lower edge by the hysteresis.
    return min(current, bucket_of(margin_c + hysteresis_c, edges_c))
