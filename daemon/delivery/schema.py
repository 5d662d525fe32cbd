"""The outbox database's tables, version by version, and the migrations between them.

The file says what it is (``PRAGMA application_id``) and which version it holds
(``PRAGMA user_version``); MIGRATIONS[v] takes it from v to v + 1.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

SCHEMA_VERSION = 6
APPLICATION_ID = 0x5247_4F42  # "RGOB": this file is a rackguard outbox

# Version 1. Version 0 is the unversioned schema of the first releases: the same
# tables without decisions.boot.
_TABLES_V1 = (
    """CREATE TABLE IF NOT EXISTS decisions (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT NOT NULL UNIQUE,
    base_key TEXT NOT NULL,
    node TEXT NOT NULL,
    action TEXT NOT NULL,
    body BLOB NOT NULL,
    origin TEXT NOT NULL,
    status TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    sent INTEGER NOT NULL DEFAULT 0,
    last_error TEXT NOT NULL DEFAULT '',
    outcome TEXT NOT NULL DEFAULT '',
    queued_at REAL NOT NULL,
    done_at REAL,
    boot TEXT NOT NULL DEFAULT ''
)""",
    "CREATE INDEX IF NOT EXISTS decisions_node ON decisions (node, seq)",
    "CREATE INDEX IF NOT EXISTS decisions_status ON decisions (status, seq)",
    "CREATE INDEX IF NOT EXISTS decisions_base_key ON decisions (base_key)",
    "CREATE TABLE IF NOT EXISTS overrides (key TEXT PRIMARY KEY, body BLOB NOT NULL)",
    """CREATE TABLE IF NOT EXISTS audit (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    actor TEXT NOT NULL,
    action TEXT NOT NULL,
    node TEXT NOT NULL,
    reason TEXT NOT NULL,
    body BLOB NOT NULL
)""",
    "CREATE INDEX IF NOT EXISTS audit_at ON audit (at)",
)
# Version 2: job notices (daemon/delivery/notices.py). One row per notice (a
# drain or exclusion applied: its deadline and where it stands) and one per job
# told, so a restart neither signals a job twice nor forgets its requeue.
_TABLES_V2 = (
    """CREATE TABLE IF NOT EXISTS notices (
    key TEXT PRIMARY KEY,
    node TEXT NOT NULL,
    action TEXT NOT NULL,
    reason TEXT NOT NULL,
    domain TEXT NOT NULL,
    noticed_at REAL NOT NULL,
    deadline REAL NOT NULL,
    told_at REAL,
    closed_at REAL,
    closed TEXT NOT NULL DEFAULT ''
)""",
    "CREATE INDEX IF NOT EXISTS notices_open ON notices (closed_at, node)",
    """CREATE TABLE IF NOT EXISTS notice_jobs (
    notice TEXT NOT NULL,
    job_id TEXT NOT NULL,
    name TEXT NOT NULL DEFAULT '',
    user TEXT NOT NULL DEFAULT '',
    signal TEXT NOT NULL DEFAULT '',
    signal_started_at REAL,
    signaled TEXT NOT NULL DEFAULT '',
    requeued_at REAL,
    requeued TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (notice, job_id)
)""",
)
# Version 3: steering (daemon/service/steering.py). Per node, the scheduler's
# setting before rackguard's first write (to restore), rackguard's last write and
# one it started (a crash may have applied it): a value that is none of them was
# set by someone else, and rackguard leaves it alone.
_TABLES_V3 = (
    """CREATE TABLE IF NOT EXISTS steering (
    node TEXT PRIMARY KEY,
    target TEXT NOT NULL,
    original TEXT,
    written TEXT,
    writing TEXT,
    written_at REAL,
    bucket INTEGER
)""",
)
# Version 5: power caps (policies/power_cap.py, daemon/service/power_cap.py). One row
# per GPU rackguard has capped: its limit, the limit enforced before (never restored
# above it) and why, so a restart neither caps twice nor forgets to restore.
_TABLES_V5 = (
    """CREATE TABLE IF NOT EXISTS power_caps (
    node TEXT NOT NULL,
    gpu TEXT NOT NULL,
    limit_w REAL NOT NULL,
    before_w REAL NOT NULL,
    cause TEXT NOT NULL,
    escalated INTEGER NOT NULL DEFAULT 0,
    capped_at REAL NOT NULL,
    PRIMARY KEY (node, gpu)
)""",
)
# Version 6: the cap log (daemon/service/power_cap.py). One row per cap, restore or
# release applied (or refused), shown in the decision log beside drains and overrides.
_TABLES_V6 = (
    """CREATE TABLE IF NOT EXISTS cap_log (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    node TEXT NOT NULL,
    action TEXT NOT NULL,
    body BLOB NOT NULL
)""",
    "CREATE INDEX IF NOT EXISTS cap_log_at ON cap_log (at)",
)
_OUR_TABLES = {
    "decisions",
    "overrides",
    "audit",
    "notices",
    "notice_jobs",
    "steering",
    "power_caps",
    "cap_log",
}


def _migrate_0_to_1(db: sqlite3.Connection, tables: set[str]) -> None:
    if "decisions" in tables:
        db.execute("ALTER TABLE decisions ADD COLUMN boot TEXT NOT NULL DEFAULT ''")
    for statement in _TABLES_V1:
        db.execute(statement)


def _migrate_1_to_2(db: sqlite3.Connection, tables: set[str]) -> None:
    for statement in _TABLES_V2:
        db.execute(statement)


def _migrate_2_to_3(db: sqlite3.Connection, tables: set[str]) -> None:
    for statement in _TABLES_V3:
        db.execute(statement)


# Version 4: a job's own deadline on a notice (a pod that appeared after the tell).
_COLUMNS_V4 = ("ALTER TABLE notice_jobs ADD COLUMN deadline REAL",)


def _migrate_3_to_4(db: sqlite3.Connection, tables: set[str]) -> None:
    for statement in _COLUMNS_V4:
        db.execute(statement)


def _migrate_4_to_5(db: sqlite3.Connection, tables: set[str]) -> None:
    for statement in _TABLES_V5:
        db.execute(statement)


def _migrate_5_to_6(db: sqlite3.Connection, tables: set[str]) -> None:
    for statement in _TABLES_V6:
        db.execute(statement)


# MIGRATIONS[v] takes a database at version v to v + 1.
MIGRATIONS: tuple[Callable[[sqlite3.Connection, set[str]], None], ...] = (
    _migrate_0_to_1,
    _migrate_1_to_2,
    _migrate_2_to_3,
    _migrate_3_to_4,
    _migrate_4_to_5,
    _migrate_5_to_6,
)
