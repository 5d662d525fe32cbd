"""Headroom buckets with hysteresis, and a node's headroom from its GPUs' (plain tables)."""

from __future__ import annotations

import pytest

from policies.headroom import NodeHeadroom
from policies.steering import bucket_of, steer_bucket

EDGES = (5.0, 10.0, 15.0)


@pytest.mark.parametrize(
    ("margin", "bucket"),
    [(-3.0, 0), (4.99, 0), (5.0, 1), (9.9, 1), (10.0, 2), (14.0, 2), (15.0, 3), (40.0, 3)],
)
def test_bucket_of(margin: float, bucket: int) -> None:
    assert bucket_of(margin, EDGES) == bucket


@pytest.mark.parametrize(
    ("margin", "current", "bucket"),
    [
        (12.0, None, 2),  # nothing in force: the plain bucket
        (10.5, 1, 1),  # up past the edge, not by the hysteresis
        (11.0, 1, 2),  # up by the hysteresis
        (9.5, 2, 2),  # down under the edge, not by the hysteresis
        (8.9, 2, 1),
        (3.0, 3, 0),  # a big fall moves all the way
        (16.5, 0, 3),  # a big rise too
        (15.5, 1, 2),  # past 10 by more than 1, past 15 by less
        (12.0, 7, 2),  # a bucket of an older config: the plain bucket
    ],
)
def test_steer_bucket_hysteresis(margin: float, current: int | None, bucket: int) -> None:
    assert steer_bucket(margin, EDGES, current, 1.0) == bucket


@pytest.mark.parametrize(
    ("margins", "expected"),
    [
        ([12.0, 8.0, 20.0], NodeHeadroom(8.0, True, 3, 3)),
        ([12.0, None, 20.0], NodeHeadroom(12.0, False, 2, 3)),  # one GPU without an estimate
        ([None, None], NodeHeadroom(None, False, 0, 2)),
        ([], NodeHeadroom(None, False, 0, 0)),  # no GPUs: nothing to trust
    ],
)
def test_node_headroom(margins: list[float | None], expected: NodeHeadroom) -> None:
    assert NodeHeadroom.of(margins) == expected
