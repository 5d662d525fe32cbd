"""The policy's words: times as people read them, reasons and details from the views."""

from __future__ import annotations

from policies.gpu import GpuView
from policies.model import REASON_PREFIX, Condition, FaultDomain
from policies.rules import Verdict
from policies.settings import PolicySettings
from policies.wording import minutes, node_detail, reason

S = PolicySettings()


def test_minutes_are_seconds_up_to_ninety() -> None:
    assert minutes(42.4) == "42s"
    assert minutes(89.6) == "90s"
    assert minutes(90.0) == "2 min"
    assert minutes(600.0) == "10 min"


def test_a_critical_reason_names_the_gpu_its_temperature_and_the_others() -> None:
    margin = S.critical_margin_c
    hot = GpuView(
        "gpu3", 0.0, Condition.CRITICAL, S, value=90.0 - margin, threshold=90.0, margin=margin
    )
    text = reason(hot, 3, FaultDomain.NODE, "", S)
    assert text == f"{REASON_PREFIX} gpu3 90C at or above slowdown 90C (+2 more GPUs)"


def test_a_rack_wide_reason_says_why_the_rack() -> None:
    hot = GpuView("gpu0", 0.0, Condition.WARNING, S, value=86.0, threshold=90.0, margin=4.0)
    text = reason(hot, 1, FaultDomain.RACK, "inlet air rising", S)
    assert text.endswith("near slowdown 90C; rack: inlet air rising")


def test_an_unknown_node_lists_its_unknown_gpus_and_the_note() -> None:
    gpus = (
        GpuView("gpu0", 0.0, Condition.UNKNOWN, S, why="temperature no reading"),
        GpuView("gpu1", 0.0, Condition.OK, S, value=60.0, threshold=90.0, margin=30.0),
    )
    text = node_detail(Verdict(Condition.UNKNOWN, False), None, gpus, "waiting")
    assert text == "gpu0: temperature no reading [waiting]"
    assert node_detail(Verdict(Condition.UNKNOWN, False), None, (), "") == "no GPU readings"
