"""The decision store: schema versions and migrations, files that are not an outbox,
a disk that refuses writes (held in memory, written on recovery), a stalled writer,
and check-config's view of the outbox's directory."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from daemon.config import ConfigError, parse_config
from daemon.config.outbox_path import location_problem
from daemon.delivery import database
from daemon.delivery.database import OutboxRefused
from daemon.delivery.deliverer import Deliverer
from daemon.delivery.outbox import DecisionStore, Status, StorageError
from daemon.delivery.schema import APPLICATION_ID, SCHEMA_VERSION
from fakes.scheduler import FakeWebhookScheduler
from policies.model import Action
from tests.support.delivery import decision
from tests.support.faulty_disk import FlakyDisk
from tests.support.paths import ROOT
from tests.support.secrets import WEBHOOK_SECRET as SECRET
from tests.support.wait import wait_until

# The unversioned schema of the first releases (version 0), as they wrote it.
_LEGACY = """
CREATE TABLE decisions (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL UNIQUE, base_key TEXT NOT NULL,
    node TEXT NOT NULL, action TEXT NOT NULL, body BLOB NOT NULL, origin TEXT NOT NULL,
    status TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, sent INTEGER NOT NULL DEFAULT 0,
    last_error TEXT NOT NULL DEFAULT '', outcome TEXT NOT NULL DEFAULT '',
    queued_at REAL NOT NULL, done_at REAL
);
CREATE TABLE overrides (key TEXT PRIMARY KEY, body BLOB NOT NULL);
CREATE TABLE audit (
    id INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, actor TEXT NOT NULL,
    action TEXT NOT NULL, node TEXT NOT NULL, reason TEXT NOT NULL, body BLOB NOT NULL
);
"""


def test_a_new_file_gets_the_current_schema(tmp_path: Path) -> None:
    store = DecisionStore(tmp_path / "o.db")
    store.close()
    db = sqlite3.connect(tmp_path / "o.db")
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert db.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID


async def test_an_unversioned_outbox_is_migrated_keeping_its_rows(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "o.db"
    old = sqlite3.connect(path)
    old.executescript(_LEGACY)
    d = decision("gpu01", Action.DRAIN)
    body = (
        b'{"node":"gpu01","action":"drain","reason":"rackguard: old","domain":"gpu",'
        b'"at":1.0,"key":"k1","evidence":[]}'
    )
    old.execute(
        "INSERT INTO decisions (key, base_key, node, action, body, origin, status, queued_at)"
        " VALUES ('k1', 'k1', 'gpu01', 'drain', ?, 'policy', 'pending', 1.0)",
        (body,),
    )
    old.execute(
        "INSERT INTO overrides VALUES ('pin:gpu02', ?)", (b'{"pin":"excluded","reason":"x"}',)
    )
    old.commit()
    old.close()
    caplog.set_level("INFO")
    store = DecisionStore(path)
    try:
        (pending,) = store.pending()
        assert pending.decision.key == "k1" and pending.decision.reason == "rackguard: old"
        assert store.overrides_at_open == [("pin:gpu02", b'{"pin":"excluded","reason":"x"}')]
        key = await store.submit(d)
        assert key and key != "k1"
    finally:
        store.close()
    assert "schema migrated from version 0 to 1" in caplog.text


def test_a_zero_byte_file_starts_fresh_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "o.db"
    path.write_bytes(b"")
    DecisionStore(path).close()
    assert "held no outbox (an empty or zero-byte file)" in caplog.text
    assert "pins and audit trail" in caplog.text


def test_a_corrupt_file_is_moved_aside_not_deleted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "o.db"
    garbage = b"this is not sqlite, it is what a bad disk left\n" * 200
    path.write_bytes(garbage)
    DecisionStore(path).close()
    (moved,) = tmp_path.glob("o.db.corrupt-*")
    assert moved.read_bytes() == garbage
    assert f"moved to {moved}" in caplog.text and "starting a fresh outbox" in caplog.text


def test_another_programs_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "grafana.db"
    other = sqlite3.connect(path)
    other.execute("CREATE TABLE dashboards (id INTEGER)")
    other.commit()
    other.close()
    with pytest.raises(OutboxRefused, match=r"belongs to something else.*dashboards"):
        DecisionStore(path)
    assert path.exists() and not list(tmp_path.glob("*.corrupt-*"))


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    DecisionStore(tmp_path / "o.db").close()
    db = sqlite3.connect(tmp_path / "o.db")
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(OutboxRefused, match="newer rackguard"):
        DecisionStore(tmp_path / "o.db")


async def test_a_full_disk_holds_decisions_in_memory_delivers_them_and_stores_them_later(
    tmp_path: Path, receiver: FakeWebhookScheduler, caplog: pytest.LogCaptureFixture
) -> None:
    from adapters.schedulers.webhook.sink import WebhookSink  # noqa: PLC0415

    caplog.set_level("INFO")
    store = DecisionStore(tmp_path / "o.db")
    disk = FlakyDisk(store._db)
    store._db = disk  # type: ignore[assignment]
    sink = WebhookSink(receiver.url, SECRET)
    deliverer = Deliverer(store, sink, retry_initial_s=0.01, retry_max_s=0.02)
    tasks = [asyncio.create_task(deliverer.run()), asyncio.create_task(store.run())]
    try:
        disk.full = True
        key = await store.submit(decision("gpu01", Action.DRAIN))
        assert [p.durable for p in store.pending()] in ([False], [])
        await wait_until(lambda: receiver.received and not store.pending())
        assert [r.key for r in receiver.received] == [key]
        ok, reason = store.health()[0]
        assert not ok and "database or disk is full" in reason and store.not_durable() == 1
        assert store.write_failures >= 1
        assert caplog.text.count("cannot write (database or disk is full)") == 1
        disk.full = False
        await wait_until(lambda: not store.write_error, timeout=15)
        assert store.not_durable() == 0 and store.health()[0][0]
        assert "writable again; every decision is durable" in caplog.text
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await sink.close()
        store.close()
    rows = sqlite3.connect(tmp_path / "o.db").execute("SELECT key, status FROM decisions")
    assert rows.fetchall() == [(key, Status.CONFIRMED.value)]


async def test_a_stalled_writer_delays_decisions_not_the_event_loop(tmp_path: Path) -> None:
    store = DecisionStore(tmp_path / "o.db")
    disk = FlakyDisk(store._db)
    store._db = disk  # type: ignore[assignment]
    disk.stall.clear()  # the next statement blocks, as on a frozen filesystem
    try:
        submitted = store.submit(decision("gpu01", Action.DRAIN))
        ticks = 0
        for _ in range(20):  # the loop keeps running while the write waits
            await asyncio.sleep(0.005)
            ticks += 1
        assert ticks == 20 and not submitted.done()
        assert store.next_ready() is None  # not delivered before it is stored
        assert store.stalled_s() > 0
        disk.stall.set()
        assert await submitted
        assert store.next_ready() is not None and store.stalled_s() == 0
    finally:
        disk.stall.set()
        store.close()


async def test_a_read_given_up_on_still_counts_while_it_holds_the_disk(tmp_path: Path) -> None:
    store = DecisionStore(tmp_path / "o.db")
    disk = FlakyDisk(store._db)
    store._db = disk  # type: ignore[assignment]
    disk.stall.clear()  # the read's statement blocks, as on a frozen filesystem
    try:

        def count(db: sqlite3.Connection) -> int:
            (n,) = db.execute("SELECT COUNT(*) FROM decisions").fetchone()
            return int(n)

        with pytest.raises(StorageError, match="busy"):
            await store.query(count, timeout_s=0.05)
        await asyncio.sleep(0.05)
        # Still on the writer thread: the stall is what the outbox reports, and its
        # storage loop waits behind it rather than probing a second time.
        assert store.stalled_s() >= 0.05
        disk.stall.set()
        await wait_until(lambda: store.stalled_s() == 0, timeout=5)
        assert await store.query(count) == 0
    finally:
        disk.stall.set()
        store.close()


def test_location_problems_name_what_cannot_be_written(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    assert location_problem(str(tmp_path / "new" / "deeper" / "o.db")) is None
    assert location_problem(":memory:") is None
    assert "is a directory" in (location_problem(str(tmp_path)) or "")
    assert "not a directory" in (location_problem(str(afile / "o.db")) or "")


def _config(secret_file: Path, outbox: Path) -> str:
    return f"""
[node]
name = "n1"
[sources.gpus]
type = "nvml"
[scheduler]
type = "webhook"
url = "http://127.0.0.1:9/x"
secret_file = "{secret_file}"
outbox_path = "{outbox}"
"""


def test_check_config_refuses_an_outbox_in_a_file_not_a_directory(
    tmp_path: Path, secret_file: Path
) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    with pytest.raises(ConfigError) as info:
        parse_config(_config(secret_file, afile / "outbox.sqlite3"))
    assert any(p.startswith("scheduler.outbox_path:") for p in info.value.problems)


def test_check_config_refuses_a_read_only_outbox_directory(
    tmp_path: Path, secret_file: Path
) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    cfg = tmp_path / "rg.toml"
    cfg.write_text(_config(secret_file, ro / "outbox.sqlite3"))
    # A read-only mount in a private mount namespace: root bypasses permission bits.
    script = f"mount -t tmpfs -o ro,size=64k tmpfs {ro} && exec {sys.executable} -m daemon.cli"
    proc = subprocess.run(
        ["unshare", "-m", "sh", "-c", f"{script} check-config {cfg}"],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    if "mount" in proc.stderr and proc.returncode not in (0, 2):
        pytest.skip(f"no private mount namespace here: {proc.stderr.strip()}")
    assert proc.returncode == 2, proc.stderr
    assert "scheduler.outbox_path:" in proc.stderr and "not writable" in proc.stderr


async def test_a_restart_on_a_full_disk_opens_the_outbox_and_holds_new_decisions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "o.db"
    first = DecisionStore(path)
    carried = await first.submit(decision("gpu01", Action.DRAIN))
    first.close()
    connect = database.connect
    monkeypatch.setattr(database, "connect", lambda p: FlakyDisk(connect(p), lambda: True))
    store = DecisionStore(path)  # no write is needed to open an outbox at the current schema
    try:
        assert [p.decision.key for p in store.pending()] == [carried]
        key = await store.submit(decision("gpu02", Action.DRAIN))
        assert key and "database or disk is full" in store.write_error
        assert [p.durable for p in store.pending()] == [True, False]
    finally:
        store.close()


async def test_a_write_whose_waiter_was_cancelled_still_lands_quietly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # At shutdown the delivery task is cancelled while it awaits a write: the write
    # still lands and is recorded, and no callback raises into the event loop (it did:
    # "InvalidStateError: invalid state" from setting a cancelled future's result).
    store = DecisionStore(tmp_path / "o.db")
    try:
        submitted = store.submit(decision("n1", Action.DRAIN))
        submitted.cancel()
        await store.write(lambda db: None)  # the submit's write is done after this one
        row = store.next_ready()
        assert row is not None
        marking = asyncio.ensure_future(store.mark_sent(row))
        await asyncio.sleep(0)  # the mark's write is under way
        marking.cancel()
        await store.write(lambda db: None)
        await asyncio.sleep(0)
        assert store.not_durable() == 0 and row.sent
        assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == []
    finally:
        store.close()
    reopened = DecisionStore(tmp_path / "o.db")
    try:
        assert [p.decision.node for p in reopened.pending()] == ["n1"]
        assert reopened.next_ready() is not None and reopened.next_ready().sent  # type: ignore[union-attr]
    finally:
        reopened.close()
