"""The reason on a ``scontrol -o show node`` line, where a reason may hold spaces and keys follow.

``Reason=`` is not last: 22.05 prints ``Comment=`` and ``Extra=`` after it (later
versions may add more keys), and Slurm appends ``[user@time]`` to the reason
itself. The reason stops at that stamp followed by the next key or the end;
without a stamp, at the next `` Key=``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_REASON_STAMP = re.compile(
    r" \[(?P<user>[^\]\s@]+)@(?P<at>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\](?= [A-Z][A-Za-z]*=|$)"
)
_NEXT_KEY = re.compile(r" (?=[A-Z][A-Za-z]*=)")


@dataclass(frozen=True, slots=True)
class ScontrolReason:
    """What follows ``Reason=`` on a ``scontrol -o show node`` line, up to the next key."""

    head: str  # the line before " Reason="
    reason: str  # without Slurm's "[user@time]"
    at: str = ""  # the time Slurm stamped, as printed (local time), "" if none


def split_reason(line: str) -> ScontrolReason:
    """The reason of one node line: it stops at the stamp, or else at the next ``Key=``."""
    head, found, rest = line.partition(" Reason=")
    if not found:
        return ScontrolReason(head, "")
    stamp = _REASON_STAMP.search(rest)
    if stamp is not None:
        return ScontrolReason(head, rest[: stamp.start()], stamp["at"])
    after = _NEXT_KEY.search(rest)
    return ScontrolReason(head, rest[: after.start()] if after else rest)
