"""The page's chart history: bounded per series and in series, one point per step."""

from __future__ import annotations

from daemon.http.charts import ChartHistory
from policies.model import Quality, Reading, SensorKind


def reading(
    kind: SensorKind,
    wall: float,
    value: float | None,
    labels: dict[str, str],
    unit: str = "celsius",
) -> Reading:
    quality, reason = (Quality.GOOD, "") if value is not None else (Quality.BAD, "lost")
    return Reading("s", "x", kind, value, unit, quality, wall, wall, reason, labels=labels)


GPU0 = {"gpu": "0"}


def test_page_chart_history_keeps_one_point_per_step_within_the_window() -> None:
    h = ChartHistory(window_s=60.0, step_s=5.0)
    for i in range(400):  # 100 s of polls every 0.25 s, warming 0.1 C a poll
        h.observe([reading(SensorKind.GPU_TEMPERATURE, 1000.0 + i * 0.25, 50.0 + i / 10, GPU0)])
    (gpu,) = h.series(now=1100.0)
    assert gpu.key == "gpu0" and gpu.unit == "celsius"
    times = [t for t, _ in gpu.points]
    assert times == sorted(times)
    assert times[-1] == 1000.0 + 399 * 0.25  # the newest value is always the last point
    assert gpu.points[-1][1] == 50.0 + 39.9
    assert len(times) <= 60 / 5 + 1 and times[0] >= 1100.0 - 60


def test_page_chart_history_is_bounded_in_series_and_skips_what_is_not_a_value() -> None:
    h = ChartHistory(window_s=60.0, step_s=5.0, max_series=3)
    inlet = SensorKind.INLET_TEMPERATURE
    h.observe(
        [
            reading(inlet, 10.0, 24.0, {"probe": f"p{i}"})
            for i in range(10)  # label churn
        ]
        + [
            reading(SensorKind.GPU_TEMPERATURE, 10.0, None, GPU0),  # BAD: not charted
            reading(SensorKind.GPU_POWER, 10.0, 300.0, GPU0, "watts"),  # not a charted kind
            reading(SensorKind.COOLANT_FLOW, float("nan"), 40.0, {}, "liters_per_minute"),
        ]
    )
    keys = [s.key for s in h.series(now=20.0)]
    assert keys == ["inlet_temperature/p0", "inlet_temperature/p1", "inlet_temperature/p2"]
    h.observe([reading(inlet, 5.0, 99.0, {"probe": "p0"})])  # the clock stepped back
    assert h.series(now=20.0)[0].points == [(10.0, 24.0)]


def test_page_chart_history_orders_gpus_numerically_then_inlet_then_the_loop() -> None:
    h = ChartHistory()
    flow = reading(SensorKind.COOLANT_FLOW, 1.0, 40.0, {}, "liters_per_minute")
    gpus = [reading(SensorKind.GPU_TEMPERATURE, 1.0, 40.0, {"gpu": str(i)}) for i in (10, 2, 1)]
    inlet = reading(SensorKind.INLET_TEMPERATURE, 1.0, 24.0, {"probe": "top"})
    h.observe([flow, *gpus, inlet])
    keys = [s.key for s in h.series(now=2.0)]
    assert keys == ["gpu1", "gpu2", "gpu10", "inlet_temperature/top", "coolant_flow"]
