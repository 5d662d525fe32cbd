"""Bisection on a sorted list of floats, for the compiled build's hot loops.

The ``bisect`` module compares items through the generic comparison protocol; a
compiled loop compares native doubles, several times cheaper (a replay bisects
the kept samples at every temperature reading and the kept slopes at every fit).
Interpreted, these loops cost more than ``bisect``'s C: callers take them only
where :data:`NATIVE`, and ``bisect`` otherwise. Same answers either way, NaN
included (a NaN ``x`` compares false with every item, as it does in ``bisect``).
"""

from __future__ import annotations

from typing import Final

NATIVE: Final = not __file__.endswith(".py")  # this module runs compiled (make native)


def left(a: list[float], x: float, lo: int, hi: int) -> int:
    """``bisect.bisect_left(a, x, lo, hi)``: the first place in ``a[lo:hi]`` with ``x <= item``."""
    while lo < hi:
        mid = (lo + hi) // 2
        if a[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


def right(a: list[float], x: float, lo: int, hi: int) -> int:
    """``bisect.bisect_right(a, x, lo, hi)``: the first place in ``a[lo:hi]`` with ``x < item``."""
    while lo < hi:
        mid = (lo + hi) // 2
        if x < a[mid]:
            hi = mid
        else:
            lo = mid + 1
    return lo
