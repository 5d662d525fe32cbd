"""A fault injected at the storage layer, where the kernel will not make the real one.

Linux refuses to remount a filesystem read-only while a file on it is open for
writing (EBUSY), and the outbox always is; so "the disk went read-only under a
running daemon" is played by a connection that answers every write the way
SQLite does on a read-only filesystem. ``FlakyDisk`` wraps the store's
connection in a test; run as a module, this starts ``rackguard`` with every
outbox connection wrapped, refusing writes while the flag file exists:

    python -m tests.support.faulty_disk FLAG_FILE run --config rg.toml
"""

from __future__ import annotations

import os
import sqlite3
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

_WRITES = ("BEGIN", "INSERT", "UPDATE", "DELETE")


class FlakyDisk:
    """A SQLite connection whose writes fail while ``refusing()`` is true; ``stall`` blocks."""

    def __init__(
        self,
        db: sqlite3.Connection,
        refusing: Callable[[], bool] | None = None,
        error: str = "database or disk is full",
    ) -> None:
        self._db = db
        self.full = False
        self._refusing = refusing or (lambda: self.full)
        self._error = error
        self.stall = threading.Event()
        self.stall.set()

    def _check(self, sql: str) -> None:
        self.stall.wait()
        verb = sql.split(maxsplit=1)[0].upper()
        if verb in _WRITES and self._refusing():
            raise sqlite3.OperationalError(self._error)

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        self._check(sql)
        return self._db.execute(sql, *args)

    def executemany(self, sql: str, rows: Sequence[Any]) -> sqlite3.Cursor:
        self._check(sql)
        return self._db.executemany(sql, rows)

    @property
    def in_transaction(self) -> bool:
        return self._db.in_transaction

    def close(self) -> None:
        self._db.close()


def main(argv: list[str]) -> int:
    """Run the daemon's CLI with outbox writes refused while ``argv[0]`` exists."""
    from daemon import cli  # noqa: PLC0415
    from daemon.delivery import database  # noqa: PLC0415
    from fakes.nvml_module import simulated_node  # noqa: PLC0415

    flag, rest = argv[0], argv[1:]
    connect = database.connect

    def wrapped(path: str) -> Any:
        return FlakyDisk(
            connect(path),
            refusing=lambda: os.path.exists(flag),
            error="attempt to write a readonly database",
        )

    database.connect = wrapped
    return cli.main(rest, nvml=simulated_node())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
