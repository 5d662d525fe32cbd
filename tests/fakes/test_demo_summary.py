"""The demo's summary says why an exclusion 'at or above slowdown' can precede the crossing."""

from __future__ import annotations

from fakes.demo import DemoDecision, DemoResult, summary


def test_the_summary_names_when_nvml_first_read_slowdown_before_the_crossing() -> None:
    result = DemoResult("pump-failure", expected_drained=("n1",))
    reason = "rackguard: gpu3 90C at or above slowdown 90C"
    result.decisions.append(DemoDecision(595.0, "n1", "exclude", reason, "gpu"))
    result.first_read_at_slowdown = (595.0, "n1", 3)
    result.first_crossing = (600.0, "n1", 3)
    lines = summary(result).splitlines()
    crossing = lines.index("  first GPU at its slowdown temperature: n1/gpu3 at +10:00")
    assert lines[crossing + 1] == (
        "  NVML read n1/gpu3 at slowdown from +09:55, 5s before:"
        " it reports whole degrees (89.5C reads 90C)"
    )
    assert "  n1: exclude 5s before that crossing" in lines


def test_the_summary_adds_nothing_when_nvml_read_it_with_the_crossing() -> None:
    result = DemoResult("hot-gpu")
    result.first_read_at_slowdown = result.first_crossing = (600.0, "n1", 3)
    assert "NVML read" not in summary(result)
