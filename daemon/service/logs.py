"""Logging set-up: plain text on a terminal, journald-friendly under systemd.

Every record is one line: the formatter escapes control characters (newlines,
NUL, ANSI escapes, ...) in the whole formatted record — message, arguments and
traceback — so text from the network (an override's reason, a receiver's error
body, a config string) can neither forge a record nor drive a terminal, and a
multi-line record (a traceback, a reload refusal) stays one journald record
with its priority, where `journalctl -p warning` finds it.
"""

from __future__ import annotations

import logging
import os
import re
import sys

from aiohttp.http_exceptions import HttpProcessingError

# syslog priorities, which journald reads from a "<N>" prefix on each line.
_PRIORITY = {
    logging.DEBUG: 7,
    logging.INFO: 6,
    logging.WARNING: 4,
    logging.ERROR: 3,
    logging.CRITICAL: 2,
}


_HANDLER_NAME = "rackguard"

# C0 and C1 controls, DEL, the Unicode line separators, and lone surrogates
# (undecodable bytes kept by surrogateescape, which stderr could not encode).
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_one(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape(text: str) -> str:
    """``text`` with every control character written as an escape (``\\n``, ``\\x1b``)."""
    return _UNSAFE.sub(_escape_one, text)


class OneLineFormatter(logging.Formatter):
    """A formatter whose every record is one line, control characters escaped."""

    def format(self, record: logging.LogRecord) -> str:
        """The record, escaped."""
        return escape(super().format(record))


class JournaldFormatter(OneLineFormatter):
    """``<priority>logger: message`` with no timestamp: journald adds its own."""

    def format(self, record: logging.LogRecord) -> str:
        """Prefix the syslog priority."""
        prio = _PRIORITY.get(record.levelno, 6)
        return f"<{prio}>{record.name}: {super().format(record)}"


class _DropUnparseableRequests(logging.Filter):
    """Drops aiohttp's error records for requests its HTTP parser rejected."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Keep every record except a parser rejection."""
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, HttpProcessingError)


def setup_logging(level: str = "info", fmt: str = "auto") -> None:
    """Configure the root logger once; safe to call again (e.g. on reload)."""
    journald = fmt == "journald" or (fmt == "auto" and "JOURNAL_STREAM" in os.environ)
    handler = logging.StreamHandler(sys.stderr)
    if journald:
        handler.setFormatter(JournaldFormatter("%(message)s"))
    else:
        handler.setFormatter(OneLineFormatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    handler.set_name(_HANDLER_NAME)
    root = logging.getLogger()
    # Replace only our own handler (a reload calls this again), never others'.
    for old in [h for h in root.handlers if h.get_name() == _HANDLER_NAME]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # aiohttp's access log would log every request: not a state change.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    # A request that cannot even be parsed is the client's problem: it gets its
    # 400, and must not put a traceback in the journal (a scanner would flood it).
    server_log = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, _DropUnparseableRequests) for f in server_log.filters):
        server_log.addFilter(_DropUnparseableRequests())
    # asyncua logs every connect at INFO and a traceback per second while a
    # session is lost; the runner already logs those state changes once.
    logging.getLogger("asyncua").setLevel(
        logging.DEBUG if level.lower() == "debug" else logging.CRITICAL
    )
