"""Rack gradients: inlet air across probe heights, coolant supply/return delta-T, margin spread.

Each is a plain function over current values; the policy reports them in the
rack's assessment and uses the spreads to tell one hot GPU or node from a
rack-wide shift.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

_BOTTOM = ("bottom", "low", "lower")
_TOP = ("top", "high", "upper")


@dataclass(frozen=True, slots=True)
class InletGradient:
    """Inlet air across the rack's probes."""

    hottest: str
    hottest_c: float
    spread_c: float  # hottest - coldest probe
    vertical_c: float | None  # top - bottom, when the probes are labelled so


def inlet_gradient(probes: Mapping[str, float]) -> InletGradient | None:
    """The gradient over probe label -> temperature; None without probes."""
    if not probes:
        return None
    hottest = max(sorted(probes), key=lambda k: probes[k])
    spread = probes[hottest] - min(probes.values())
    bottom = next((v for k, v in probes.items() if k.lower() in _BOTTOM), None)
    top = next((v for k, v in probes.items() if k.lower() in _TOP), None)
    vertical = top - bottom if top is not None and bottom is not None else None
    return InletGradient(hottest, probes[hottest], spread, vertical)


def coolant_delta_t(supply_c: float | None, return_c: float | None) -> float | None:
    """Return minus supply: the heat the loop carries per unit of flow."""
    if supply_c is None or return_c is None:
        return None
    return return_c - supply_c


def margin_spread(margins: Mapping[str, float]) -> float | None:
    """Largest minus smallest margin (of GPUs of a node, or of the nodes of a rack)."""
    if len(margins) < 2:
        return None
    return max(margins.values()) - min(margins.values())
