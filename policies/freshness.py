"""Whether a reading may be acted on now: usable, not stale, and not an absent series."""

from __future__ import annotations

from math import isfinite

from policies.model import Quality, Reading


def absent(r: Reading | None, ever_usable: bool) -> bool:
    """A series that is absent (not fitted) and was never present: neither fault nor evidence.

    A series that was present and then reports absent is a change worth not trusting:
    it stays unknown like a BAD one.
    """
    return r is not None and r.quality is Quality.ABSENT and not ever_usable


def fresh(r: Reading | None, now: float, stale_after_s: float) -> tuple[float | None, str]:
    """The value of a reading a policy may act on now, or None and why not."""
    if r is None:
        return None, "no reading"
    if not r.usable or r.value is None:
        return None, f"{r.quality.value}: {r.reason}"
    age = now - r.mono
    if age > stale_after_s:
        return None, f"stale ({age:.0f}s old)"
    return r.value, ""


def fresh_value(r: Reading | None, now: float, stale_after_s: float) -> float | None:
    """``fresh(r, now, stale_after_s)[0]``, without the words of why not."""
    if r is None or r.quality is not Quality.GOOD:
        return None
    value = r.value
    if value is None or not isfinite(value) or now - r.mono > stale_after_s:
        return None
    return value
