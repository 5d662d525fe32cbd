"""The worker groups of `make test` (tests/conftest.py) reach pytest-xdist's scheduler.

A group that does not arrive is silent: the tests still pass, but a shared Slurm is
started on every worker and real-time clusters share the cores their speed was chosen
for. Two things broke it before: our hook ran after xdist's (which reads the marks),
and pytest 9.2's node ids drop the group suffix xdist writes (pytest-xdist#1386).
"""

from __future__ import annotations

import pytest


def _group(item: pytest.Item) -> str | None:
    marks = [m.args[0] for m in item.iter_markers("xdist_group") if m.args]
    return marks[0] if marks else None


def test_tests_that_share_a_service_or_the_cores_are_grouped(
    request: pytest.FixtureRequest,
) -> None:
    groups = {item.nodeid.split("@")[0]: _group(item) for item in request.session.items}
    by_path = {nodeid.split("::")[0]: group for nodeid, group in groups.items()}
    expected = {
        "tests/e2e/test_scenarios.py": "e2e-real-time",
        "tests/systemd/test_real_systemd.py": "systemd-and-wheel",
        "tests/policies/test_scenarios.py": "tests/policies/test_scenarios.py",
    }
    for path, group in expected.items():
        if path in by_path:  # collected in this run (a run may select a subset)
            assert by_path[path] == group, path
    assert groups.get(request.node.nodeid.split("@")[0]) is None  # this test is free


def test_under_loadgroup_every_grouped_test_carries_its_group_in_its_id(
    request: pytest.FixtureRequest,
) -> None:
    if not request.config.getoption("loadgroup", default=False):
        # Serially there is no scheduler to reach: what reaches it is checked by the
        # marks above, and by this test when `make test` runs it under xdist.
        assert _group(request.node) is None
        return
    for item in request.session.items:
        group = _group(item)
        if group is not None:
            assert item.nodeid.endswith(f"@{group}"), item.nodeid
    assert "@" not in request.node.nodeid  # an ungrouped test keeps its own id
