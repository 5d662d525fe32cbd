"""Slurm hostlists: is a node in ``gpu[01-03,07],login1``?

A job's ``nodes`` (slurmrestd) is a hostlist expression: comma-separated items,
each a name with zero or more bracket groups of numbers and ranges; a range's
low end sets the zero padding (``[08-10]``: gpu08, gpu09, gpu10). Membership is
tested without expanding, so a job on 10 000 nodes costs one regex per item.
"""

from __future__ import annotations

import re
from functools import lru_cache

_GROUP = re.compile(r"\[([^\[\]]*)\]")


class HostlistError(ValueError):
    """The expression is not a hostlist."""


def split_items(expr: str) -> list[str]:
    """Top-level comma-separated items (commas inside brackets belong to the group)."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(expr):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"unbalanced ']' in {expr!r}")
        elif ch == "," and depth == 0:
            items.append(expr[start:i])
            start = i + 1
    if depth != 0:
        raise HostlistError(f"unbalanced '[' in {expr!r}")
    items.append(expr[start:])
    return [item.strip() for item in items if item.strip()]


Ranges = tuple[tuple[int, int, int], ...]  # (low, high, width) per comma part of a group


@lru_cache(maxsize=1024)
def _compile(item: str) -> tuple[re.Pattern[str], tuple[Ranges, ...]]:
    pattern, groups, at = "", [], 0
    for m in _GROUP.finditer(item):
        pattern += re.escape(item[at : m.start()]) + r"(\d+)"
        groups.append(_ranges(m.group(1), item))
        at = m.end()
    if "[" in item[at:] or "]" in item[at:]:
        raise HostlistError(f"bad brackets in {item!r}")
    return re.compile(pattern + re.escape(item[at:])), tuple(groups)


def _ranges(body: str, item: str) -> Ranges:
    out = []
    for part in body.split(","):
        lo, _, hi = part.strip().partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise HostlistError(f"bad range {part!r} in {item!r}")
        width = len(lo) if lo.startswith("0") and len(lo) > 1 else 1
        out.append((int(lo), int(hi or lo), width))
    return tuple(out)


def hostlist_has(expr: str, node: str) -> bool:
    """True when ``node`` is one of the names ``expr`` stands for; raises HostlistError."""
    for item in split_items(expr):
        pattern, groups = _compile(item)
        m = pattern.fullmatch(node)
        if m is None:
            continue
        if all(_in(digits, ranges) for digits, ranges in zip(m.groups(), groups, strict=True)):
            return True
    return False


def _in(digits: str, ranges: Ranges) -> bool:
    n = int(digits)
    return any(lo <= n <= hi and f"{n:0{width}d}" == digits for lo, hi, width in ranges)
