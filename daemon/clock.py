"""One clock for people: Unix time on the wire; monotonic seconds stay inside the process.

The policy stamps what it sees on the monotonic clock (immune to the wall clock
being stepped). Whatever an operator or another program reads (the API, its
events, the decision log, a webhook's body) says when in Unix time, and its
schema says so (``UnixTime``). The replay trace keeps its monotonic stamps
under the name ``mono`` (policies/trace.py).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated

from msgspec import Meta, structs

from policies.model import Assessment, Decision

UNIX_TIME = "Unix time: seconds since 1970-01-01T00:00:00Z"
UnixTime = Annotated[float, Meta(description=UNIX_TIME)]


def assessment_in_unix(a: Assessment, offset: float) -> Assessment:
    """``a`` with its ``at`` moved by ``offset`` (Unix time minus monotonic)."""
    return structs.replace(a, at=a.at + offset)


def decision_in_unix(d: Decision, now_mono: float) -> Decision:
    """``d`` with its evidence stamped in Unix time, as ``d.at`` (taken at ``now_mono``) is."""
    offset = d.at - now_mono
    return replace(d, evidence=tuple(assessment_in_unix(a, offset) for a in d.evidence))
