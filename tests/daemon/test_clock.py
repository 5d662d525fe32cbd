"""One clock for people: a decision's evidence leaves the engine in Unix time, as its ``at``."""

from __future__ import annotations

import pytest

from daemon.clock import decision_in_unix
from policies.model import Action, Assessment, Condition, Decision, FaultDomain


def assessment(subject: str, at: float) -> Assessment:
    return Assessment(subject, FaultDomain.GPU, Condition.WARNING, at, 80.0, "celsius")


def test_evidence_is_moved_onto_the_decisions_clock() -> None:
    # Evaluated at monotonic 435.78, Unix 1_790_000_000.0; the rack's view is 12 s older.
    now_mono, wall = 435.78, 1_790_000_000.0
    d = Decision(
        "n1",
        Action.DRAIN,
        "rackguard: hot",
        FaultDomain.GPU,
        wall,
        "rg-1",
        (assessment("node", now_mono), assessment("rack", now_mono - 12.0)),
    )
    out = decision_in_unix(d, now_mono)
    assert [a.at for a in out.evidence] == pytest.approx([wall, wall - 12.0])
    assert out.at == wall and out.key == d.key
    assert [a.subject for a in out.evidence] == ["node", "rack"]
