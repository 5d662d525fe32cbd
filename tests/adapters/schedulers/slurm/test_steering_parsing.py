"""The Weight of a ``scontrol -o show node`` line (a table; the real scontrol is in
test_steering_slurm.py)."""

from __future__ import annotations

import pytest

from adapters.schedulers.slurm.weight import parse_weight

LINE = (
    "NodeName=gpu03 Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 State=IDLE ThreadsPerCore=1"
    " TmpDisk=0 Weight={w} Owner=N/A MCS_label=N/A Partitions=gpu"
)


@pytest.mark.parametrize(
    ("line", "weight"),
    [
        (LINE.format(w="1"), "1"),
        (LINE.format(w="4294967294"), "4294967294"),
        ("NodeName=gpu03 Weight=7", "7"),
        ("NodeName=gpu03 State=IDLE", None),
        ("NodeName=gpu03 Reason=Weight=3 [root@now]", None),  # a reason is not the weight
        ("NodeName=gpu03 State=IDLE+DRAIN Reason=set Weight=9 later [root@now]", None),
        ("", None),
    ],
)
def test_parse_weight(line: str, weight: str | None) -> None:
    assert parse_weight(line) == weight
