"""A rack's tracker: loss runs that confirm lost flow, and stamps of what it reads as."""

from __future__ import annotations

from policies.model import Quality, Reading, SensorKind
from policies.rack_tracker import LossRun, RackTracker
from policies.settings import PolicySettings


def test_a_loss_run_needs_two_samples_the_confirm_window_apart() -> None:
    run = LossRun()
    run.update(0.0, True)
    run.update(3.0, True)
    assert not run.confirmed(5.0)
    run.update(5.0, True)
    assert run.confirmed(5.0)
    run.update(6.0, False)  # one healthy sample ends the run
    run.update(7.0, True)
    assert not run.confirmed(5.0)


def _supply(t: float) -> Reading:
    return Reading(
        "cdu", "supply", SensorKind.COOLANT_SUPPLY_TEMPERATURE, 30.0, "celsius",
        Quality.GOOD, t, 1e9 + t, labels={"rack": "r1"},
    )  # fmt: skip


def test_a_stamp_holds_until_a_reading_is_taken_goes_stale_or_time_goes_back() -> None:
    rt = RackTracker(PolicySettings(rack_stale_after_s=30.0))
    rt.observe(_supply(0.0))
    rt.observe(_supply(10.0))
    stamp = rt.stamp(10.0)
    assert rt.reads_as(stamp, 10.0) and rt.reads_as(stamp, 31.0)
    assert not rt.reads_as(stamp, 9.0)  # time went back
    # The unit misses its polls (the usual 10 s interval, twice, and a second) before
    # its reading goes stale: silent at 31 s.
    assert not rt.reads_as(stamp, 31.5)
    quiet = rt.stamp(31.5)
    assert quiet.silent and rt.reads_as(quiet, 40.0)
    assert not rt.reads_as(quiet, 40.5)  # the supply of 10 s gone stale
    gone = rt.stamp(40.5)
    assert gone.oldest_fresh is None and rt.reads_as(gone, 1000.0)
    rt.observe(_supply(1000.0))
    assert not rt.reads_as(gone, 1000.0)
    again = rt.stamp(1000.0)
    rt.configure(PolicySettings(rack_stale_after_s=60.0))  # a reload: read again
    assert not rt.reads_as(again, 1000.0)
