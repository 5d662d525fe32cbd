"""The wire shape of a decision, shared by the HTTP API and the webhook sink."""

from __future__ import annotations

from typing import Any

from policies.model import Assessment, Decision


def assessment_to_dict(a: Assessment) -> dict[str, Any]:
    """An assessment as plain JSON-able data."""
    return {
        "subject": a.subject,
        "domain": a.domain.value,
        "condition": a.condition.value,
        "value": a.value,
        "unit": a.unit,
        "threshold": a.threshold,
        "trend_per_min": a.trend_per_min,
        "time_to_threshold_s": a.time_to_threshold_s,
        "detail": a.detail,
    }


def decision_to_dict(d: Decision) -> dict[str, Any]:
    """A decision as plain JSON-able data."""
    return {
        "node": d.node,
        "action": d.action.value,
        "reason": d.reason,
        "domain": d.domain.value,
        "at": d.at,
        "key": d.key,
        "dry_run": d.dry_run,
        "evidence": [assessment_to_dict(a) for a in d.evidence],
    }
