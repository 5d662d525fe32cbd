"""Steering the Slurm Weight through slurmrestd (>= 23.02, the REST write path), against the
fake slurmrestd: the update_node_msg weight, an administrator's weight left alone, the
original restored, and the weight of a node object in every shape."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from adapters.schedulers.slurm.auth import JwtToken
from adapters.schedulers.slurm.backend import SlurmBackend
from adapters.schedulers.slurm.client import SlurmClient
from adapters.schedulers.slurm.weight import rest_weight
from daemon.service.steering import Steering
from fakes.slurmrestd import FakeSlurmrestd
from tests.support.secrets import write_secret
from tests.support.steering import Knobs

NODE = "gpu02"


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlurmrestd]:
    server = FakeSlurmrestd()
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def backend(fake: FakeSlurmrestd, tmp_path: Path) -> AsyncIterator[SlurmBackend]:
    token = tmp_path / "jwt"
    write_secret(token, "token-root\n")
    # No scontrol on this host: a write that fell back to it would fail the test.
    b = SlurmBackend(
        SlurmClient(fake.url, token=JwtToken(token), scontrol=("/nonexistent/scontrol",))
    )
    yield b
    await b.sink().close()


async def test_the_weight_goes_through_the_rest_node_update(
    fake: FakeSlurmrestd, steer: Steering, knobs: Knobs
) -> None:
    fake.nodes[NODE].weight = 10
    knobs.margin(3.0)
    await steer.step()
    assert fake.nodes[NODE].weight == 4 and steer.state == "steered"
    posts = [p for m, p in fake.requests if m == "POST"]
    assert posts == [f"/slurm/v0.0.42/node/{NODE}"], fake.requests
    knobs.set(enabled=False)
    await steer.step()
    assert fake.nodes[NODE].weight == 10 and steer.writes["restored"] == 1


async def test_an_administrators_rest_weight_is_left_alone(
    fake: FakeSlurmrestd, steer: Steering, knobs: Knobs
) -> None:
    knobs.margin(3.0)
    await steer.step()
    fake.nodes[NODE].weight = 77  # scontrol update Weight=77, or a REST client
    knobs.later(400)
    knobs.margin(17.0)
    await steer.step()
    assert fake.nodes[NODE].weight == 77 and steer.state == "foreign"
    knobs.set(enabled=False)
    await steer.step()
    assert fake.nodes[NODE].weight == 77


@pytest.mark.parametrize(
    ("raw", "weight"),
    [
        (1, "1"),
        ({"set": True, "infinite": False, "number": 30}, "30"),
        ({"set": False, "infinite": False, "number": 0}, None),
        ({"set": True, "infinite": True, "number": 0}, "4294967295"),  # INFINITE
        (None, None),
        ("3", None),
        (True, None),
    ],
)
def test_rest_weight(raw: Any, weight: str | None) -> None:
    assert rest_weight(raw) == weight
