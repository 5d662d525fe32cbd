"""Non-finite values never count as readings: not in a Reading, a trace, a window or a tracker."""

from __future__ import annotations

import math

import msgspec
import pytest

from policies.kernel.buckets import BucketWindow
from policies.model import Quality, Reading, SensorKind
from policies.trace import TraceError, encode_header, parse
from policies.tracking import Tracker
from tests.policies.rack_sim import (
    S,
    cdu,
    gpus,
)

# -- non-finite values never count as readings -----------------------------------------


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("quality", [Quality.GOOD, Quality.UNCERTAIN])
def test_reading_rejects_non_finite_values(value: float, quality: Quality) -> None:
    with pytest.raises(ValueError, match=r"gpu0\.temperature: .*non-finite"):
        Reading(
            "gpus", "gpu0.temperature", SensorKind.GPU_TEMPERATURE, value, "celsius",
            quality, 1.0, 1.0, reason="" if quality is Quality.GOOD else "maybe",
        )  # fmt: skip


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity", "1e999", "-1e999"])
def test_trace_rejects_non_finite_numbers_with_the_line(token: str) -> None:
    line = (
        '{"type":"reading","source":"cdu","sensor":"supply","kind":"coolant_supply_temperature",'
        f'"value":{token},"unit":"celsius","quality":"good","mono":1.0,"wall":1.0}}'
    )
    _, records = parse([encode_header({"r1": ["n1"]}), line])
    with pytest.raises(TraceError, match=r"^line 2: non-finite number"):
        list(records)


def test_header_with_a_non_finite_number_is_rejected() -> None:
    with pytest.raises(TraceError, match=r"^line 1: non-finite number"):
        parse(['{"type":"header","format":"rackguard-trace","version":1,"racks":{},"x":NaN}'])


def test_windows_and_trackers_never_take_a_non_finite_value() -> None:
    w = BucketWindow(10.0, 60.0)
    assert w.add(1.0, 5.0) is False
    assert w.add(2.0, math.nan) is False and w.add(3.0, math.inf) is False
    w.add(11.0, 5.0)
    assert [b.value for b in w.buckets()] == [5.0]
    # A reading forged past its checks (force_setattr) is not usable, nor tracked.
    tracker = Tracker(S, {"r1": ("n1",)})
    good = gpus("n1", 0.0, [60.0])
    forged = gpus("n1", 1.0, [60.0])[-1]
    msgspec.structs.force_setattr(forged, "value", math.nan)
    tracker.observe([*good, forged])
    g = tracker.nodes["n1"].gpus["0"]
    assert not forged.usable
    assert g.margin.window.last_t == 0.0  # the NaN never reached the window
    nan_supply = cdu(2.0, {"supply": 30.0})[0]
    msgspec.structs.force_setattr(nan_supply, "value", math.inf)
    tracker.observe([nan_supply])
    assert tracker.rack["r1"].slow[SensorKind.COOLANT_SUPPLY_TEMPERATURE]
    series = next(iter(tracker.rack["r1"].slow[SensorKind.COOLANT_SUPPLY_TEMPERATURE].values()))
    assert series.raw.last_t is None and series.forecaster.window.last_t is None
