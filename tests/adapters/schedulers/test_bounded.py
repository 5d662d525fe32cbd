"""Peers' answers are read to a bounded size, and HTTP errors sort into the three kinds."""

from __future__ import annotations

import sys

import pytest

from adapters.base import http_error
from adapters.schedulers.command import OUTPUT_LIMIT, run_command


async def test_a_flooding_command_costs_at_most_the_limit() -> None:
    # e.g. a token-refresh command gone wrong: 20 MB on stdout and stderr.
    flood = "import sys; sys.stdout.write('x' * 20_000_000); sys.stderr.write('y' * 20_000_000)"
    rc, out, err = await run_command([sys.executable, "-c", flood], timeout_s=30)
    assert rc == 0  # read to the end (the child never blocks on a full pipe), kept capped
    assert len(out) == OUTPUT_LIMIT and len(err) == OUTPUT_LIMIT


@pytest.mark.parametrize(
    ("status", "final", "permanent", "reason"),
    [
        (400, True, True, "malformed"),
        (422, True, True, "malformed"),
        (401, False, True, "auth"),
        (403, False, True, "auth"),
        (404, False, True, "not_found"),
        (410, False, True, "refused"),
        (408, False, False, "unreachable"),
        (429, False, False, "unreachable"),
        (503, False, False, "unreachable"),
    ],
)
def test_http_errors_sort_into_transient_operator_fixable_and_final(
    status: int, final: bool, permanent: bool, reason: str
) -> None:
    err = http_error(f"HTTP {status}", status)
    assert (err.final, err.permanent, err.reason) == (final, permanent, reason)
