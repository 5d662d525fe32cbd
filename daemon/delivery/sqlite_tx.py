"""One way to run a write transaction on the shared SQLite connection."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator


@contextlib.contextmanager
def transaction(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """BEGIN IMMEDIATE ... COMMIT; anything failing (the COMMIT included) rolls back.

    A failed COMMIT left without a ROLLBACK would leave the connection inside a
    transaction, and every later BEGIN would fail.
    """
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
