"""A reading a policy may act on: usable and fresh; otherwise the words say why not."""

from __future__ import annotations

import pytest

from policies.freshness import absent, fresh, fresh_value
from policies.model import Quality, Reading, SensorKind


def _reading(value: float | None, quality: Quality, mono: float = 10.0) -> Reading:
    reason = "" if quality is Quality.GOOD else "BadSensorFailure"
    return Reading("cdu", "supply", SensorKind.COOLANT_SUPPLY_TEMPERATURE, value, "celsius",
                   quality, mono, mono, reason)  # fmt: skip


@pytest.mark.parametrize(
    ("r", "now", "want"),
    [
        (None, 10.0, (None, "no reading")),
        (_reading(None, Quality.BAD), 10.0, (None, "bad: BadSensorFailure")),
        (_reading(30.0, Quality.GOOD), 40.0, (None, "stale (30s old)")),
        (_reading(30.0, Quality.GOOD), 29.0, (30.0, "")),
    ],
)
def test_fresh_gives_the_value_or_why_not(
    r: Reading | None, now: float, want: tuple[float | None, str]
) -> None:
    assert fresh(r, now, 20.0) == want
    assert fresh_value(r, now, 20.0) == want[0]


def test_an_absent_series_is_absent_only_until_it_was_ever_usable() -> None:
    gone = _reading(None, Quality.ABSENT)
    assert absent(gone, ever_usable=False)
    assert not absent(gone, ever_usable=True)  # present, then gone: a change, not absence
    assert not absent(_reading(None, Quality.BAD), ever_usable=False)
    assert not absent(None, ever_usable=False)
