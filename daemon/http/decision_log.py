"""The decision log, newest first: decisions (from the outbox), power cap changes (the
cap log) and operator overrides (the audit).

Paged with a cursor — the (time, kind, id) of the last item returned —
so a page boundary never skips or repeats an entry while new ones arrive.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass
from typing import Any

import msgspec
import orjson
from msgspec import UNSET, UnsetType

from daemon.delivery.deliverer import confirmed_by
from daemon.http.bodies import Delivery, LogItem
from daemon.service.power_cap import CapRecord

MAX_LIMIT = 500
# The (time, kind, id) of the last entry returned, readable. Every string of this
# pattern is a position in the log, so every one is accepted: a client needs
# nothing but the pattern to know what the server takes.
CURSOR_PATTERN = (
    r"^-?[0-9]{1,20}(\.[0-9]{1,20})?(e[+-]?[0-9]{1,3})?_(decision|override|cap)_[0-9]{1,18}$"
)
_CURSOR = re.compile(
    r"(?P<at>-?[0-9]+(\.[0-9]+)?(e[+-]?[0-9]+)?)_(?P<kind>decision|override|cap)_(?P<id>[0-9]+)"
)


class QueryError(ValueError):
    """A bad filter or cursor; the message names the parameter."""


@dataclass(frozen=True, slots=True)
class LogQuery:
    """Filters and paging for one request."""

    node: str | None = None
    action: str | None = None
    kind: str | None = None  # "decision", "override" or "cap"
    since: float | None = None
    until: float | None = None
    limit: int = 100
    cursor: str | None = None


def encode_cursor(at: float, kind: str, ident: int) -> str:
    """The cursor of the entry after which the next page starts (CURSOR_PATTERN)."""
    return f"{at!r}_{kind}_{ident}"


def decode_cursor(cursor: str) -> tuple[float, str, int]:
    """The (at, kind, id) inside a cursor; QueryError when it is not of CURSOR_PATTERN."""
    match = _CURSOR.fullmatch(cursor)
    if match is None:
        raise QueryError(f"cursor: a string of {CURSOR_PATTERN!r}, a page's next_cursor")
    return float(match["at"]), match["kind"], int(match["id"])


_UNION = """
SELECT 'decision' AS kind, seq AS id, queued_at AS at, node, action, body,
       status, attempts, last_error, outcome, origin AS who, done_at
FROM decisions
UNION ALL
SELECT 'override', id, at, node, action, body, '', 0, '', '', actor, NULL
FROM audit
UNION ALL
SELECT 'cap', id, at, node, action, body, '', 0, '', '', '', NULL
FROM cap_log
"""


def page(db: sqlite3.Connection, q: LogQuery) -> tuple[list[LogItem], str | None]:
    """One page of the log and the cursor of the next page (None at the end)."""
    where: list[str] = []
    args: list[Any] = []
    for column, value in (("node", q.node), ("action", q.action), ("kind", q.kind)):
        if value is not None:
            where.append(f"{column} = ?")
            args.append(value)
    if q.since is not None:
        where.append("at >= ?")
        args.append(q.since)
    if q.until is not None:
        where.append("at < ?")
        args.append(q.until)
    if q.cursor:
        where.append("(at, kind, id) < (?, ?, ?)")
        args.extend(decode_cursor(q.cursor))
    sql = f"SELECT * FROM ({_UNION})"
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += " ORDER BY at DESC, kind DESC, id DESC LIMIT ?"
    args.append(q.limit + 1)
    rows = db.execute(sql, args).fetchall()
    items = [_item(row) for row in rows[: q.limit]]
    more = len(rows) > q.limit
    next_cursor = None
    if more and items:
        last = items[-1]
        next_cursor = encode_cursor(last.at, last.kind, last.id)
    return items, next_cursor


def _item(row: tuple[Any, ...]) -> LogItem:
    kind, ident, at, node, action, body, status, attempts, last_error, outcome, who, done = row
    # The stored bodies are shown as they were written (an older version's included).
    data = orjson.loads(body)
    if kind == "override":
        return LogItem(kind, ident, at, node, action, actor=who, override=data)
    if kind == "cap":
        return LogItem(kind, ident, at, node, action, cap=_cap(data))
    delivery = Delivery(
        status, attempts, last_error, outcome, who, done, confirmed_by(status, outcome)
    )
    return LogItem(kind, ident, at, node, action, decision=data, delivery=delivery)


def _cap(data: Any) -> CapRecord | UnsetType:
    """A cap log row's record; one this version cannot read (a newer version's, changed)
    is listed without it rather than failing the page."""
    try:
        return msgspec.convert(data, CapRecord)
    except msgspec.ValidationError:
        return UNSET
