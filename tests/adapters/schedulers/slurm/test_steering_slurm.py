"""Steering as the Slurm node Weight, against a real slurmctld (22.05) through scontrol.

Written once per interval, with hysteresis; a weight an administrator set with
``scontrol update Weight=`` since rackguard's write is left alone (and not
restored over); the original weight comes back when steering is disabled.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator

import pytest

from adapters.schedulers.slurm.auth import JwtToken
from adapters.schedulers.slurm.backend import SlurmBackend
from adapters.schedulers.slurm.client import SlurmClient
from adapters.schedulers.slurm.weight import parse_weight
from daemon.service.steering import Steering
from tests.support.slurm import Cluster
from tests.support.steering import Knobs

# "sink" named here so that its parameters (scontrol, rest) apply to every test.
pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("backend")]

NODE = "gpu03"


@pytest.fixture
def node(clean: Cluster) -> Iterator[Cluster]:
    clean.scontrol("update", f"NodeName={NODE}", "Weight=1")
    yield clean
    clean.scontrol("update", f"NodeName={NODE}", "Weight=1", check=False)


@pytest.fixture(params=["scontrol", "rest"])
async def backend(node: Cluster, request: pytest.FixtureRequest) -> AsyncIterator[SlurmBackend]:
    # "rest": reads through slurmrestd (22.05 serves no node update: writes fall back
    # to scontrol, as the decisions' do).
    if request.param == "rest":
        client = SlurmClient(
            node.rest_url, token=JwtToken(node.token_file), slurm_conf=node.conf, timeout_s=20.0
        )
    else:
        client = SlurmClient(None, slurm_conf=node.conf, timeout_s=20.0)
    b = SlurmBackend(client)
    yield b
    await b.sink().close()


def weight(cluster: Cluster) -> str | None:
    return parse_weight(cluster.show(NODE))


async def test_the_weight_follows_the_headroom_once_per_interval_with_hysteresis(
    node: Cluster, steer: Steering, knobs: Knobs
) -> None:
    knobs.margin(3.0)  # bucket 0: least headroom, the highest weight
    await steer.step()
    assert weight(node) == "4" and steer.row is not None and steer.row.original == "1"
    knobs.later(60)
    knobs.margin(12.0)
    await steer.step()
    assert weight(node) == "4" and steer.state == "rate_limited"
    knobs.later(300)
    await steer.step()
    assert weight(node) == "2"
    for margin in (9.5, 10.4, 9.1):  # around the 10 C edge, within the hysteresis
        knobs.later(400)
        knobs.margin(margin)
        await steer.step()
        assert weight(node) == "2", margin
    assert steer.writes["written"] == 2


async def test_an_administrators_weight_is_left_alone(
    node: Cluster, steer: Steering, knobs: Knobs, caplog: pytest.LogCaptureFixture
) -> None:
    knobs.margin(3.0)
    await steer.step()
    assert weight(node) == "4"
    node.scontrol("update", f"NodeName={NODE}", "Weight=50")
    caplog.set_level(logging.WARNING)
    for margin in (17.0, 12.0):
        knobs.later(400)
        knobs.margin(margin)
        await steer.step()
    assert weight(node) == "50" and steer.state == "foreign"
    assert steer.status().value == "50"
    assert len([r for r in caplog.records if "someone else" in r.getMessage()]) == 1
    knobs.set(enabled=False)
    await steer.step()
    assert weight(node) == "50" and steer.row is None  # not restored over the admin's


async def test_disabled_restores_the_original_weight(
    node: Cluster, steer: Steering, knobs: Knobs
) -> None:
    node.scontrol("update", f"NodeName={NODE}", "Weight=7")
    knobs.margin(12.0)
    await steer.step()
    assert weight(node) == "2"
    knobs.set(enabled=False)
    await steer.step()
    assert weight(node) == "7" and steer.writes["restored"] == 1 and steer.state == "disabled"


async def test_a_node_rackguard_drained_keeps_its_weight(
    node: Cluster, steer: Steering, knobs: Knobs
) -> None:
    knobs.margin(3.0)
    knobs.held = True
    await steer.step()
    assert weight(node) == "1" and steer.state == "held"
