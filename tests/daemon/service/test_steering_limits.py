"""Issue 37, items 8 and 9: steering within Kubernetes' label rules and a bounded rate.

Against the fake API server (which validates labels as the API server does,
with an implementation of its own), the real decision store, and the config
parser check-config uses.
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest

from adapters.schedulers.kubernetes import label as label_module
from adapters.schedulers.kubernetes.backend import KubernetesBackend
from adapters.schedulers.kubernetes.label import label_key_problem, label_value_problem
from daemon.config import ConfigError, parse_config
from daemon.delivery.outbox import DecisionStore
from daemon.service.steering import Steering
from fakes.kube_api import FakeKubeApi, label_problem
from tests.daemon.config.test_config import MINIMAL
from tests.daemon.config.test_steering_config import SLURM
from tests.daemon.service.test_steering_kubernetes import LABEL, NODE, api, backend, label
from tests.support.steering import Knobs, steering

__all__ = ["api", "backend"]  # the fixtures, shared with test_steering_kubernetes

PREFIX_253 = ".".join(["a" * 63] * 4)[:253].rstrip(".")
KEYS = [
    # (key, valid as the API server says)
    ("rackguard.io/thermal-headroom", True),
    ("thermal", True),
    (f"{PREFIX_253}/x", len(PREFIX_253) <= 253),
    (f"{'a' * 254}/x", False),  # a prefix over 253
    ("example.com/" + "n" * 63, True),
    ("example.com/" + "n" * 64, False),  # a name over 63
    ("Example.com/x", False),  # the prefix is lower case
    ("a/b/c", False),
    ("/x", False),
    ("example.com/", False),
    ("example.com/-x", False),
    ("example.com/x_y.z-1", True),
    ("a..b/x", False),
    ("thermal headroom", False),
]


def steering_config(lines: str) -> str:
    return MINIMAL + SLURM + f"[steering]\nenabled = true\n{lines}\n"


@pytest.mark.parametrize(("key", "valid"), KEYS)
def test_steering_limits_label_keys_are_checked_as_the_api_server_checks_them(
    key: str, valid: bool
) -> None:
    assert (label_key_problem(key) == "") is valid
    assert (label_problem(key, "1") == "") is valid  # the fake, as the API server
    if valid:
        parse_config(steering_config(f"label_key = {key!r}".replace("'", '"')))
    else:
        with pytest.raises(ConfigError, match=r"steering\.label_key: not a valid Kubernetes label"):
            parse_config(steering_config(f'label_key = "{key}"'))


@pytest.mark.parametrize(
    ("value", "valid"),
    [("3", True), ("", True), ("v" * 63, True), ("v" * 64, False), ("-3", False), ("a b", False)],
)
def test_steering_limits_label_values_are_checked_as_the_api_server_checks_them(
    value: str, valid: bool
) -> None:
    assert (label_value_problem(value) == "") is valid
    assert (label_problem("k", value) == "") is valid


@pytest.mark.parametrize(
    ("lines", "problem"),
    [
        ("min_interval_s = 0", "steering.min_interval_s: must be at least 60"),
        ("min_interval_s = 59.9", "steering.min_interval_s: must be at least 60"),
        ("interval_s = 0.001", "steering.interval_s: must be at least 10"),
        ("weights = [4294967290, 3, 2, 1]", "steering.weights: each must be from 1 to 4294967280"),
    ],
)
def test_steering_limits_a_floor_on_the_rate_and_weights_slurm_sets(
    lines: str, problem: str
) -> None:
    with pytest.raises(ConfigError, match=problem):
        parse_config(steering_config(lines))
    parse_config(steering_config("min_interval_s = 60\ninterval_s = 10"))
    parse_config(steering_config("weights = [4294967280, 3, 2, 1]"))


async def steered_thrice_with_a_long_label(
    backend: KubernetesBackend, store: DecisionStore, knobs: Knobs
) -> Steering:
    """Three steps, a write due at each, with a label key whose name is over 63."""
    knobs.set(label_key="example.com/" + "n" * 64)  # as a config that skipped the checks
    steer = steering(NODE, backend, store, knobs)
    knobs.margin(3.0)
    for _ in range(3):
        await steer.step()
        knobs.later(400)
    return steer


async def test_steering_limits_an_invalid_label_is_refused_before_any_write_and_for_good(
    api: FakeKubeApi, backend: KubernetesBackend, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    knobs = Knobs()
    store = DecisionStore(tmp_path / "o.db")
    try:
        steer = await steered_thrice_with_a_long_label(backend, store, knobs)
    finally:
        store.close()
    assert api.patches == []
    assert steer.state == "refused" and "invalid" in steer.detail and "63" in steer.detail
    assert len([r for r in caplog.records if r.levelno == logging.ERROR]) == 1


async def test_steering_limits_a_422_on_a_label_is_invalid_not_foreign_and_final(
    api: FakeKubeApi,
    backend: KubernetesBackend,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Our own check switched off: the API server's answer is what is tested.
    monkeypatch.setattr(label_module, "label_key_problem", lambda key: "")
    knobs = Knobs()
    store = DecisionStore(tmp_path / "o.db")
    try:
        steer = await steered_thrice_with_a_long_label(backend, store, knobs)
        assert len(api.patches) == 1  # refused once, not asked again for this value
        status = steer.status()
        assert status.state == "refused" and "HTTP 422" in status.detail
        assert "name part must be no more than 63" in status.detail
        assert steer.writes["foreign"] == 0 and steer.writes["failed"] == 1
        # Another value wanted (another bucket) is asked once more.
        knobs.margin(17.0)
        await steer.step()
        assert len(api.patches) == 2 and steer.state == "refused"
    finally:
        store.close()
    assert len([r for r in caplog.records if r.levelno == logging.ERROR]) == 2


async def test_steering_limits_a_crash_between_write_and_record_does_not_reread_forever(
    api: FakeKubeApi, backend: KubernetesBackend, tmp_path: Path
) -> None:
    # The label was written ("0"), then the daemon died before recording it.
    api.edit_node(NODE, {"metadata": {"labels": {LABEL: "0"}}})
    store = DecisionStore(tmp_path / "o.db")
    await store.write(
        lambda db: db.execute(
            "INSERT INTO steering VALUES (?, ?, ?, ?, ?, ?, ?)",
            (NODE, f"kubernetes label {LABEL}", None, None, "0", None, None),
        )
    )
    store.close()
    store = DecisionStore(tmp_path / "o.db")
    knobs = Knobs()
    try:
        steer = steering(NODE, backend, store, knobs)
        knobs.margin(3.0)  # bucket 0: "0", what is in place
        await steer.step()
        assert steer.row is not None and (steer.row.written, steer.row.writing) == ("0", None)
        reads = api.node_reads
        for _ in range(9):  # 270 s of 30 s intervals, within min_interval_s (300 s)
            knobs.later(30)
            await steer.step()
        assert api.node_reads == reads and steer.state == "steered"
    finally:
        store.close()
    row = sqlite3.connect(tmp_path / "o.db").execute("SELECT written, writing FROM steering")
    assert row.fetchall() == [("0", None)]
    assert label(api) == "0" and api.patches == []


async def test_steering_limits_reads_are_bounded_by_min_interval_at_every_state(
    api: FakeKubeApi, steer: Steering, knobs: Knobs
) -> None:
    """Reads per node: at most one per min_interval_s, plus two per write."""
    api.edit_node(NODE, {"metadata": {"labels": {LABEL: "3"}}})
    knobs.margin(17.0)  # bucket 3, already in place: nothing to write
    for _ in range(100):  # 3000 s of 30 s intervals
        await steer.step()
        knobs.later(30)
    assert api.patches == [] and api.node_reads <= 3000 / 300 + 1
    # Someone else's value: looked at once per min_interval_s too, not every interval.
    knobs.margin(3.0)
    await steer.step()
    assert label(api) == "0" and len(api.patches) == 1
    api.edit_node(NODE, {"metadata": {"labels": {LABEL: "x"}}})
    knobs.later(300)
    reads = api.node_reads
    for margin in [3.0, 17.0] * 50:  # flapping across every bucket
        knobs.margin(margin)
        await steer.step()
        knobs.later(30)
    assert steer.state == "foreign" and api.node_reads - reads <= 3000 / 300 + 1
    assert label(api) == "x" and len(api.patches) == 1
