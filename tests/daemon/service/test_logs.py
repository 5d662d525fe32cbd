"""Logging set-up: journald priorities, and no traceback for a request that cannot be parsed."""

from __future__ import annotations

import logging

import pytest
from aiohttp.http_exceptions import BadHttpMethod

from daemon.service.logs import JournaldFormatter, setup_logging


def record(level: int, exc: BaseException | None = None) -> logging.LogRecord:
    exc_info = (type(exc), exc, None) if exc is not None else None
    return logging.LogRecord(
        "aiohttp.server", level, __file__, 1, "Error handling request", None, exc_info
    )


def test_unparseable_requests_are_dropped_real_errors_kept() -> None:
    setup_logging("info", "text")
    setup_logging("info", "text")  # again, as a reload does: one filter, not two
    server = logging.getLogger("aiohttp.server")
    assert len(server.filters) == 1
    (drop,) = server.filters
    assert isinstance(drop, logging.Filter)
    assert not drop.filter(record(logging.ERROR, BadHttpMethod("BREW")))
    assert drop.filter(record(logging.ERROR, ValueError("a bug")))  # real errors still logged
    assert drop.filter(record(logging.ERROR))


@pytest.mark.parametrize(
    ("level", "prefix"),
    [
        (logging.DEBUG, "<7>"),
        (logging.INFO, "<6>"),
        (logging.WARNING, "<4>"),
        (logging.ERROR, "<3>"),
    ],
)
def test_journald_lines_carry_the_syslog_priority_and_no_timestamp(level: int, prefix: str) -> None:
    line = JournaldFormatter("%(message)s").format(
        logging.LogRecord(
            "daemon.service.runner", level, __file__, 1, "gpus: source up", None, None
        )
    )
    assert line == f"{prefix}daemon.service.runner: gpus: source up"
