"""Reading a decision log in any of the forms rackguard writes one: (wall time, node, action) rows.

* the daemon's ``/v1/decisions`` (a URL, followed page by page, or a saved JSON body);
* its outbox (the SQLite file of ``[scheduler] outbox_path``);
* ``rackguard replay`` output (JSON lines of ``decision`` records).
"""

from __future__ import annotations

import sqlite3
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import orjson

Row = tuple[float, str, str]  # (wall time, node, action)
SQLITE_MAGIC = b"SQLite format 3\x00"
MAX_PAGES = 1000


class LogError(ValueError):
    """A decision log that cannot be read; the message names it and what is wrong."""


def _row(item: Any, where: str) -> Row | None:
    if not isinstance(item, dict):
        raise LogError(f"{where}: not a JSON object")
    if item.get("kind", "decision") != "decision" or item.get("type", "decision") != "decision":
        return None  # overrides, readings, headers
    try:
        return float(item["at"]), str(item["node"]), str(item["action"])
    except (KeyError, TypeError, ValueError) as err:
        raise LogError(f"{where}: a decision needs at, node and action ({err})") from err


def _items(body: Any, where: str) -> list[Any]:
    if isinstance(body, dict) and isinstance(body.get("items"), list):
        return list(body["items"])
    if isinstance(body, list):
        return body
    raise LogError(f"{where}: expected a /v1/decisions body ({{'items': [...]}}) or a list")


def read_url(url: str, timeout_s: float = 10.0) -> list[Row]:
    """Every decision of a daemon's /v1/decisions, following next_cursor."""
    rows: list[Row] = []
    cursor: str | None = None
    for _ in range(MAX_PAGES):
        sep = "&" if "?" in url else "?"
        page_url = url + (f"{sep}cursor={urllib.parse.quote(cursor)}" if cursor else "")
        try:
            with urllib.request.urlopen(page_url, timeout=timeout_s) as rsp:
                body = orjson.loads(rsp.read())
        except (urllib.error.URLError, OSError, orjson.JSONDecodeError) as err:
            raise LogError(f"{url}: {err}") from err
        for i, item in enumerate(_items(body, url)):
            row = _row(item, f"{url} item {i}")
            if row is not None:
                rows.append(row)
        cursor = body.get("next_cursor") if isinstance(body, dict) else None
        if not cursor:
            return rows
    raise LogError(f"{url}: more than {MAX_PAGES} pages")


def read_file(path: Path) -> list[Row]:
    """Every decision in an outbox, a saved /v1/decisions body or replay output."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise LogError(f"{path}: {err.strerror or err}") from err
    if data.startswith(SQLITE_MAGIC):
        try:
            with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
                return [
                    (float(at), str(node), str(action))
                    for at, node, action in db.execute(
                        "SELECT queued_at, node, action FROM decisions ORDER BY queued_at"
                    )
                ]
        except sqlite3.Error as err:
            raise LogError(f"{path}: not a rackguard outbox: {err}") from err
    try:
        whole = orjson.loads(data)
    except orjson.JSONDecodeError:
        whole = None  # JSON lines
    if isinstance(whole, list) or (isinstance(whole, dict) and "items" in whole):
        return [
            row
            for i, item in enumerate(_items(whole, str(path)))
            if (row := _row(item, f"{path} item {i}")) is not None
        ]
    rows: list[Row] = []
    for n, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = orjson.loads(line)
        except orjson.JSONDecodeError as err:
            raise LogError(f"{path}: line {n}: not JSON: {err}") from err
        row = _row(item, f"{path}: line {n}")
        if row is not None:
            rows.append(row)
    return rows


def read_log(source: str) -> list[Row]:
    """A URL or a file path."""
    if source.startswith(("http://", "https://")):
        return read_url(source)
    return read_file(Path(source))
