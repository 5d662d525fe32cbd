"""The table `make bench` prints: one row per measurement, with its reference and ratio."""

from __future__ import annotations

import statistics
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Row:
    """One measured quantity against a reference measured in the same run."""

    name: str
    value: float
    unit: str
    reference_name: str = ""
    reference: float | None = None
    target: str = ""
    ok: bool | None = None

    @property
    def ratio(self) -> float | None:
        """value / reference, when there is a reference."""
        if self.reference is None or self.reference == 0:
            return None
        return self.value / self.reference


def median(values: list[float]) -> float:
    """The median; these machines are noisy, means mislead."""
    return statistics.median(values)


def render(rows: list[Row]) -> str:
    """An aligned text table."""
    header = ("measurement", "value", "reference (same run)", "ratio", "target", "")
    cells = [header]
    for r in rows:
        ref = f"{r.reference:.4g} {r.unit} ({r.reference_name})" if r.reference is not None else "-"
        ratio = f"{r.ratio:.2f}x" if r.ratio is not None else "-"
        verdict = "" if r.ok is None else ("ok" if r.ok else "MISSED")
        cells.append((r.name, f"{r.value:.4g} {r.unit}", ref, ratio, r.target or "-", verdict))
    widths = [max(len(c[i]) for c in cells) for i in range(len(header))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
