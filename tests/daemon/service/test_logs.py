"""Logging set-up: journald priorities, and no traceback for a request that cannot be parsed."""

from __future__ import annotations

import logging

import pytest
from aiohttp.http_exceptions import BadHttpMethod

from daemon.service.logs import JournaldFormatter, OneLineFormatter, escape, setup_logging


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


@pytest.mark.parametrize("formatter", [JournaldFormatter("%(message)s"), OneLineFormatter()])
def test_untrusted_text_cannot_forge_a_record_or_drive_a_terminal(
    formatter: logging.Formatter,
) -> None:
    actor = "mallory\n<3>daemon.app: node drained by admin\r\x00\x1b[2J\x9b\u2028"
    rec = logging.LogRecord(
        "daemon.app", logging.WARNING, __file__, 1, "override by %s", (actor,), None
    )
    line = formatter.format(rec)
    assert "\n" not in line and "\r" not in line and "\x00" not in line
    assert "\x1b" not in line and "\x9b" not in line and "\u2028" not in line
    assert "mallory\\n<3>daemon.app: node drained by admin\\r\\x00\\x1b[2J" in line


def test_a_traceback_is_one_journald_record_with_its_priority() -> None:
    try:
        raise ValueError("bad value\nsecond line")
    except ValueError as err:
        exc = (type(err), err, err.__traceback__)
    rec = logging.LogRecord(
        "daemon.service.reloader", logging.ERROR, __file__, 1, "reload failed", None, exc
    )
    line = JournaldFormatter("%(message)s").format(rec)
    assert line.startswith("<3>daemon.service.reloader: reload failed\\nTraceback")
    assert "\n" not in line and "ValueError: bad value\\nsecond line" in line


def test_undecodable_bytes_kept_as_surrogates_are_escaped() -> None:
    text = b"caf\xe9".decode("utf-8", "surrogateescape")
    assert escape(text) == "caf\\udce9"
    escape(text).encode("utf-8")  # stderr can write it
