"""The outbox's SQLite file: the lock that keeps it to one process, opening, migrating.

A corrupt file is moved aside and a fresh one started; a file of another
program, or of a newer schema, is refused (OutboxRefused).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import sqlite3
import time
from pathlib import Path
from typing import IO

from daemon.config.outbox_path import MEMORY
from daemon.delivery.schema import APPLICATION_ID, MIGRATIONS, SCHEMA_VERSION
from daemon.delivery.sqlite_tx import transaction

log = logging.getLogger(__name__)

BUSY_TIMEOUT_MS = 5000
_SQLITE_CORRUPT = 11
_SQLITE_NOTADB = 26


class OutboxBusy(Exception):
    """Another process holds this outbox; two deliverers would apply decisions twice."""


class OutboxRefused(Exception):
    """The file at the outbox path is not an outbox this version may use; says why."""


def take_lock(path: Path) -> IO[bytes]:
    """Hold ``<path>.lock`` for as long as the handle is open; OutboxBusy if another does."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fh = (path.parent / (path.name + ".lock")).open("ab")
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as err:
        fh.close()
        raise OutboxBusy(f"outbox {path} is in use by another rackguard process") from err
    return fh


def connect(path: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    return db


def _prepare(db: sqlite3.Connection, path: str, existed: bool) -> None:
    """Check what the file is, then migrate it to SCHEMA_VERSION; raises OutboxRefused."""
    (check,) = db.execute("PRAGMA quick_check").fetchone()
    if check != "ok":
        raise sqlite3.DatabaseError(f"integrity check failed: {check}")
    (version,) = db.execute("PRAGMA user_version").fetchone()
    (app_id,) = db.execute("PRAGMA application_id").fetchone()
    tables = {
        name
        for (name,) in db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        )
    }
    if app_id not in (0, APPLICATION_ID) or (tables and "decisions" not in tables):
        raise OutboxRefused(
            f"outbox {path}: this SQLite file belongs to something else (tables: "
            f"{', '.join(sorted(tables)) or 'none'}); rackguard will not touch it; "
            "point scheduler.outbox_path at a file of its own"
        )
    if version > SCHEMA_VERSION:
        raise OutboxRefused(
            f"outbox {path}: schema version {version} was written by a newer rackguard "
            f"(this one knows up to {SCHEMA_VERSION}); run that version, or move the file aside"
        )
    if existed and not tables:
        log.warning(
            "outbox %s existed but held no outbox (an empty or zero-byte file): whatever "
            "decision history, intents, pins and audit trail it was meant to hold are lost; "
            "starting a fresh outbox there",
            path,
        )
    if path != MEMORY:
        db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA synchronous = FULL")
    for v in range(version, SCHEMA_VERSION):
        with transaction(db):
            MIGRATIONS[v](db, tables)
            db.execute(f"PRAGMA user_version = {v + 1}")
            db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        if tables:
            log.info("outbox %s: schema migrated from version %d to %d", path, v, v + 1)


def _move_aside(path: str) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = Path(f"{path}.corrupt-{stamp}")
    os.replace(path, target)
    for suffix in ("-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.replace(path + suffix, f"{target}{suffix}")
    return target


def open_database(path: str) -> sqlite3.Connection:
    """The outbox's connection, at SCHEMA_VERSION.

    A file SQLite cannot read as a database (corrupt, garbage) is moved aside —
    never deleted — and a fresh outbox started, with a WARNING naming both: the
    agent must go on protecting the node, and the operator can still recover
    the old file. A SQLite file of another program, or of a newer schema, is
    refused (OutboxRefused): moving that aside would break its owner.
    """
    existed = path != MEMORY and Path(path).exists()
    db = connect(path)
    try:
        _prepare(db, path, existed)
    except sqlite3.DatabaseError as err:
        db.close()
        code = getattr(err, "sqlite_errorcode", None)
        if not existed or (code not in (_SQLITE_CORRUPT, _SQLITE_NOTADB) and code is not None):
            raise
        moved = _move_aside(path)
        log.warning(
            "outbox %s is not a readable SQLite database (%s): moved to %s; its decision "
            "history, intents, pins and audit trail are not used; starting a fresh outbox",
            path,
            err,
            moved,
        )
        db = connect(path)
        try:
            _prepare(db, path, False)
        except BaseException:
            db.close()
            raise
    except BaseException:
        db.close()
        raise
    return db


def probe(db: sqlite3.Connection) -> str:
    """Whether a write transaction could start now ("" if so); never waits for a lock."""
    try:
        db.execute("PRAGMA busy_timeout = 0")
        try:
            db.execute("BEGIN IMMEDIATE")
            db.execute("ROLLBACK")
        finally:
            db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    except sqlite3.Error as err:
        return str(err) or type(err).__name__
    return ""
