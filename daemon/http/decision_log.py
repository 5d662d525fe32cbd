"""The decision log: decisions (from the outbox) and operator overrides (the audit), newest first.

Paged with an opaque cursor — the (time, kind, id) of the last item returned —
so a page boundary never skips or repeats an entry while new ones arrive.
"""

from __future__ import annotations

import base64
import sqlite3
from dataclasses import dataclass
from typing import Any

import orjson

from daemon.delivery.deliverer import confirmed_by
from daemon.http.bodies import Delivery, LogItem

MAX_LIMIT = 500


class QueryError(ValueError):
    """A bad filter or cursor; the message names the parameter."""


@dataclass(frozen=True, slots=True)
class LogQuery:
    """Filters and paging for one request."""

    node: str | None = None
    action: str | None = None
    kind: str | None = None  # "decision" or "override"
    since: float | None = None
    until: float | None = None
    limit: int = 100
    cursor: str | None = None


def encode_cursor(at: float, kind: str, ident: int) -> str:
    """An opaque cursor for the entry after which the next page starts."""
    return base64.urlsafe_b64encode(orjson.dumps([at, kind, ident])).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[float, str, int]:
    """The (at, kind, id) inside a cursor; QueryError when it is not one of ours."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        at, kind, ident = orjson.loads(raw)
    except (ValueError, TypeError) as err:
        raise QueryError("cursor: not a cursor returned by this API") from err
    if not isinstance(at, int | float) or kind not in ("decision", "override"):
        raise QueryError("cursor: not a cursor returned by this API")
    if not isinstance(ident, int):
        raise QueryError("cursor: not a cursor returned by this API")
    return float(at), kind, ident


_UNION = """
SELECT 'decision' AS kind, seq AS id, queued_at AS at, node, action, body,
       status, attempts, last_error, outcome, origin AS who, done_at
FROM decisions
UNION ALL
SELECT 'override', id, at, node, action, body, '', 0, '', '', actor, NULL
FROM audit
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
    delivery = Delivery(
        status, attempts, last_error, outcome, who, done, confirmed_by(status, outcome)
    )
    return LogItem(kind, ident, at, node, action, decision=data, delivery=delivery)
