"""An independent client, schemathesis, holds a live daemon to its own /openapi.json.

It reads the document the daemon serves, generates requests from it (the
documented examples, the boundaries of every parameter and body, each
undeclared method, and random schema-valid and schema-invalid data) and sends
them to a real daemon with a token set, so overrides are enabled. Every one of
schemathesis' checks runs on every answer: no 5xx; only declared statuses;
declared content types, headers and body schemas; schema-valid requests
accepted and schema-invalid ones refused; a 405 with ``Allow``; the token asked
for where the document says so. Any mismatch fails the test.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import schemathesis
from schemathesis.engine import Status, events, from_schema

from daemon.http.openapi import OPENAPI
from tests.support.live_api import live_api

TOKEN = "conformance-token"
# Enough to reach every branch of each operation's schema on a 2-core machine:
# the coverage phase adds each boundary and undeclared method besides these.
MAX_EXAMPLES = 25


@dataclass
class Run:
    """What one run found, and what it covered."""

    failures: list[str] = field(default_factory=list)
    # Operations each phase sent at least one request to.
    covered: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    skipped: list[str] = field(default_factory=list)


def run_schemathesis(base: str, token: str) -> Run:
    """Every phase, as ``schemathesis run`` would: examples, coverage, fuzzing, stateful."""
    config = schemathesis.Config.from_dict(
        {
            "base-url": base,
            "auth": {"openapi": {"bearer": {"bearer": token}}},
            "request-timeout": 10,
            # Each run on its own: no observations kept from an earlier run.
            "cache": {"enabled": False},
            # The event stream ends (tests/support/live_api.py); read a few events at most.
            "max-stream-events": 3,
            "generation": {"max-examples": MAX_EXAMPLES, "deterministic": True},
            "checks": {"enabled": True},
        }
    )
    schema = schemathesis.openapi.from_url(f"{base}/openapi.json", config=config)
    run = Run()
    for event in from_schema(schema).execute():
        if isinstance(event, events.NonFatalError):
            run.failures.append(f"error: {event.label}: {event.info.format()}")
        elif isinstance(event, events.FatalError):
            run.failures.append(f"fatal: {event.exception!r}")
        elif isinstance(event, events.ScenarioFinished):
            _record(run, event)
    return run


def _record(run: Run, event: events.ScenarioFinished) -> None:
    recorder, phase = event.recorder, str(event.phase)
    # The examples phase skips operations the document gives no example for.
    if event.status == Status.SKIP and phase in ("coverage", "fuzzing"):
        run.skipped.append(f"[{phase}] {recorder.label}: {event.skip_reason}")
    for node in recorder.cases.values():
        run.covered[phase].add(node.value.operation.label)
    for case_id, checks in recorder.checks.items():
        for check in checks:
            if check.failure_info is None:
                continue
            case = recorder.cases[case_id].value
            run.failures.append(
                f"[{phase}] {check.name}: {case.operation.label} "
                f"{check.failure_info.failure.title}\n  {check.failure_info.code_sample}"
            )


def test_openapi_conformance(tmp_path: Path) -> None:
    with live_api(tmp_path, TOKEN) as api:
        run = run_schemathesis(api.base, api.token)
    assert not run.failures, "\n".join(sorted(set(run.failures)))
    assert not run.skipped, run.skipped
    # Nothing left out: every operation had its boundaries and its random data, and
    # the links (the log's next page, an override's audit entry) were followed.
    # All but the document itself, which schemathesis leaves out as the one it read.
    operations = {
        f"{method.upper()} {path}"
        for path, ops in OPENAPI["paths"].items()
        for method in ops
        if path != "/openapi.json"
    }
    assert run.covered["coverage"] == operations
    assert run.covered["fuzzing"] == operations
    assert {"GET /v1/decisions", "POST /v1/overrides"} <= run.covered["stateful"]
    assert "POST /v1/overrides" in run.covered["examples"]
