"""The wire shape of a decision, shared by the HTTP API and the webhook sink.

Derived from the model (:mod:`policies.codec`): every field of the dataclass,
less what the wire leaves out (an assessment's node-local monotonic ``at``).
"""

from __future__ import annotations

from typing import Any

from policies.codec import assessment_wire, decision_wire
from policies.model import Assessment, Decision


def assessment_to_dict(a: Assessment) -> dict[str, Any]:
    """An assessment as plain JSON-able data."""
    return assessment_wire(a)


def decision_to_dict(d: Decision) -> dict[str, Any]:
    """A decision as plain JSON-able data."""
    return decision_wire(d)
