"""A rack's tracker: loss runs that confirm lost flow."""

from __future__ import annotations

from policies.rack_tracker import LossRun


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
