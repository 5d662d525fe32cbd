"""Issue 37, item 7: steering within what the running Slurm (22.05, real slurmctld) accepts.

scontrol sets a weight up to 4294967280 and refuses anything above ("Weight
value (4294967281) is greater than 4294967280", rc 1); an
administrator's ``Weight=INFINITE`` shows as 4294967295 (scontrol) or as
``infinite`` (slurmrestd) and is a value rackguard could never write back:
the node is left alone, said once, never overwritten.
"""

from __future__ import annotations

import logging

import pytest

from adapters.schedulers.slurm.weight import INFINITE, SLURM_MAX_WEIGHT
from daemon.service.steering import Steering
from tests.adapters.schedulers.slurm.test_steering_slurm import (
    NODE,
    backend,
    node,
    weight,
)
from tests.support.slurm import Cluster
from tests.support.steering import Knobs

__all__ = ["backend", "node"]  # the fixtures, shared with test_steering_slurm
pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("backend")]


async def test_steering_limits_the_weight_bound_is_the_one_scontrol_enforces(
    node: Cluster,
) -> None:
    refused = node.scontrol(
        "update", f"NodeName={NODE}", f"Weight={SLURM_MAX_WEIGHT + 1}", check=False
    )
    said = refused.stderr + refused.stdout
    assert refused.returncode != 0 and f"is greater than {SLURM_MAX_WEIGHT}" in said
    node.scontrol("update", f"NodeName={NODE}", f"Weight={SLURM_MAX_WEIGHT}")
    assert weight(node) == str(SLURM_MAX_WEIGHT)
    node.scontrol("update", f"NodeName={NODE}", "Weight=INFINITE")
    assert weight(node) == INFINITE  # shown as 4294967295


async def test_steering_limits_an_infinite_weight_is_left_alone_said_once_never_overwritten(
    node: Cluster, steer: Steering, knobs: Knobs, caplog: pytest.LogCaptureFixture
) -> None:
    node.scontrol("update", f"NodeName={NODE}", "Weight=INFINITE")
    caplog.set_level(logging.WARNING)
    for margin in (3.0, 12.0, 17.0, 3.0):
        knobs.margin(margin)
        await steer.step()
        assert steer.state == "left_alone", steer.detail
        knobs.later(400)
    assert weight(node) == INFINITE and steer.row is None
    assert steer.writes["written"] == 0 and steer.writes["failed"] == 0
    said = [r for r in caplog.records if "could not write back" in r.getMessage()]
    assert len(said) == 1 and INFINITE in said[0].getMessage()
    assert "left alone" in steer.status().detail
    # Disabled: nothing of rackguard's to restore, nothing written.
    knobs.set(enabled=False)
    await steer.step()
    assert weight(node) == INFINITE
    # The administrator sets a number again: steering takes over from there.
    node.scontrol("update", f"NodeName={NODE}", "Weight=9")
    knobs.set(enabled=True)
    knobs.margin(3.0)
    await steer.step()
    assert weight(node) == "4" and steer.row is not None and steer.row.original == "9"


async def test_steering_limits_an_infinite_weight_after_rackguards_write_is_foreign_for_good(
    node: Cluster, steer: Steering, knobs: Knobs
) -> None:
    knobs.margin(3.0)
    await steer.step()
    assert weight(node) == "4"
    node.scontrol("update", f"NodeName={NODE}", "Weight=INFINITE")
    for margin in (12.0, 17.0):
        knobs.later(400)
        knobs.margin(margin)
        await steer.step()
        assert steer.state == "foreign"
    knobs.set(enabled=False)
    await steer.step()
    assert weight(node) == INFINITE and steer.writes["failed"] == 0  # not restored over it
