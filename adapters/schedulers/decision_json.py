"""The wire shape of a decision, shared by the HTTP API and the webhook sink.

Derived from the model (:mod:`policies.codec`): every field of the dataclass,
less what the wire leaves out (an assessment's node-local monotonic ``at``).
"""

from __future__ import annotations

import time
from typing import Any

from policies.codec import assessment_wire, decision_wire
from policies.model import Assessment, Decision


def assessment_to_dict(a: Assessment) -> dict[str, Any]:
    """An assessment as plain JSON-able data."""
    return assessment_wire(a)


def decision_to_dict(d: Decision) -> dict[str, Any]:
    """A decision as plain JSON-able data."""
    return decision_wire(d)


def rfc3339(t: float) -> str:
    """Unix time as RFC 3339 UTC, to the second: ``2026-12-01T23:40:00Z``."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
