"""One GPU at one evaluation: its condition from its margin, its shutdown distance and forecast."""

from __future__ import annotations

import pytest

from policies.gpu import GpuView, assess_gpu, gpu_order, least_margin
from policies.gpu_tracker import GpuTracker
from policies.model import Condition, Quality, Reading, SensorKind
from policies.settings import PolicySettings

S = PolicySettings()


def _gpu(temp: float | None, slowdown: float = 90.0, shutdown: float = 100.0) -> GpuTracker:
    g = GpuTracker(S)
    for kind, value in (
        (SensorKind.GPU_SLOWDOWN_THRESHOLD, slowdown),
        (SensorKind.GPU_SHUTDOWN_THRESHOLD, shutdown),
        (SensorKind.GPU_TEMPERATURE, temp),
    ):
        quality = Quality.GOOD if value is not None else Quality.BAD
        g.observe(Reading("gpus", "x", kind, value, "celsius", quality, 0.0, 0.0,
                          "" if value is not None else "lost"))  # fmt: skip
    return g


@pytest.mark.parametrize(
    ("temp", "shutdown", "want"),
    [
        (60.0, 100.0, Condition.OK),
        (90.0 - S.enter_margin_c, 100.0, Condition.WARNING),
        (90.0 - S.critical_margin_c, 100.0, Condition.CRITICAL),
        (80.0, 80.0 + S.shutdown_margin_c, Condition.CRITICAL),  # near shutdown
    ],
)
def test_the_condition_follows_the_margin(temp: float, shutdown: float, want: Condition) -> None:
    view = assess_gpu("0", _gpu(temp, shutdown=shutdown), 1.0, None, S)
    assert view.condition is want
    assert view.margin == pytest.approx(90.0 - temp)
    assert view.assessment.subject == "gpu0" and view.assessment.condition is want


def test_a_gpu_without_a_temperature_is_unknown_and_says_why() -> None:
    view = assess_gpu("2", _gpu(None), 1.0, None, S)
    assert view.condition is Condition.UNKNOWN and view.margin is None
    assert view.detail == "temperature bad: lost"


def test_a_stale_temperature_is_unknown() -> None:
    view = assess_gpu("0", _gpu(60.0), S.stale_after_s + 1.0, None, S)
    assert view.condition is Condition.UNKNOWN
    assert view.detail.startswith("temperature stale")


def test_gpus_sort_by_index_and_the_least_margin_wins_ties_by_order() -> None:
    assert sorted(["10", "2", "x", "0"], key=gpu_order) == ["0", "2", "10", "x"]
    a = GpuView("gpu0", 0.0, Condition.OK, S, margin=5.0)
    b = GpuView("gpu1", 0.0, Condition.OK, S, margin=5.0)
    c = GpuView("gpu2", 0.0, Condition.OK, S, margin=None)
    assert least_margin([c, a, b]) is a
    assert least_margin([c]) is None
