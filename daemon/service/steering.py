"""Steering: publish this node's headroom at full load so the scheduler prefers cool nodes.

Opt-in ([steering] enabled). Every ``interval_s`` the policy's latest headroom
(policies/headroom.py, NodeHeadroom) becomes a bucket (policies/steering.py,
with hysteresis) and the bucket a value of a node setting: a Slurm Weight or a
Kubernetes label (adapters/schedulers/slurm/weight.py, kubernetes/label.py). The rules:

1. Only a trusted headroom acts (every GPU read and estimated); otherwise the
   setting stays as it is.
2. A node rackguard holds out of service is left alone: the drain keeps work off.
   While a decision for the node waits for delivery, steering waits too: it runs
   as its own task, never in the decision outbox, and never ahead of a drain.
3. At most one write per ``min_interval_s``; the value in place is read again
   at that cadence (a slurmctld restart or reconfig restores slurm.conf's weight).
4. Read before write. Before its first write rackguard stores the value it found
   (the original) in the outbox database; before each write, the value it is
   about to write; after it, the value written. A value that is none of these was
   set by someone else since: rackguard leaves it, says so once at WARNING and in
   GET /v1/steering, and goes on only once the value is one of its own again.
5. Disabled (at start or by a reload): the original is written back where the
   value is still rackguard's, and the stored row is dropped.

6. A value rackguard could not write back (Slurm's ``Weight=INFINITE``, shown
   as 4294967295; a label value the API server would refuse) found before the
   first write means the node is left alone (state ``left_alone``), said once,
   and read again only every ``min_interval_s``: never overwritten.
7. A write the scheduler refuses for good (``scontrol``'s "not a valid number",
   a 422 on a label) is final for that value: state ``refused`` in GET
   /v1/steering, logged once at ERROR, not asked again until the value wanted
   changes (another bucket, a reload).
8. A write that went through before a crash could record it (the row says
   ``writing`` = the value in place) is completed on the next read, so the node
   is not re-read every interval.

Other scheduler failures are logged (WARNING once, then DEBUG) and counted, and
the step is tried again at the next interval.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from adapters.base import DeliveryError
from adapters.schedulers.backend import Backend
from adapters.schedulers.node_setting import NodeSetting, SettingChanged
from daemon.clock import UnixTime
from daemon.config.steering import SteeringConfig
from daemon.delivery.outbox import DecisionStore, StorageError
from daemon.poller import Backoff, Poller
from policies.headroom import NodeHeadroom
from policies.steering import steer_bucket

log = logging.getLogger(__name__)

# Results counted by rackguard_steering_writes_total{result}.
RESULTS = ("written", "restored", "foreign", "failed")


class _Unreachable(Exception):
    """A step that could not reach the scheduler (said by :meth:`Steering._failed`)."""


@dataclass(slots=True)
class SteeringRow:
    """What rackguard knows of a node's setting (one row of the ``steering`` table)."""

    node: str
    target: str
    original: str | None  # the value before rackguard's first write (None: not set)
    written: str | None = None  # rackguard's last confirmed write
    writing: str | None = None  # a write started, not confirmed (a crash may have applied it)
    written_at: float | None = None  # wall clock
    bucket: int | None = None

    def ours(self, value: str | None) -> bool:
        """The value is the original or one rackguard wrote (or was writing)."""
        return value == self.original or (
            value is not None and value in (self.written, self.writing)
        )

    def params(self) -> tuple[Any, ...]:
        return (
            self.node,
            self.target,
            self.original,
            self.written,
            self.writing,
            self.written_at,
            self.bucket,
        )


@dataclass(frozen=True, slots=True)
class SteeringStatus:
    """GET /v1/steering: where steering of this node stands."""

    enabled: bool
    node: str
    target: str  # "slurm weight", "kubernetes label <key>"
    # disabled, untrusted, held, waiting, steered, rate_limited, foreign, failed,
    # left_alone (a value rackguard could not write back), refused (final for a value)
    state: str
    detail: str
    headroom_c: float | None
    trusted: bool
    bucket: int | None
    value: str | None  # as last read from the scheduler
    original: str | None
    written: str | None
    written_at: UnixTime | None
    next_write_at: UnixTime | None
    writes: dict[str, int] = field(default_factory=dict)


_UPSERT = (
    "INSERT INTO steering (node, target, original, written, writing, written_at, bucket)"
    " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(node) DO UPDATE SET target = excluded.target,"
    " original = excluded.original, written = excluded.written, writing = excluded.writing,"
    " written_at = excluded.written_at, bucket = excluded.bucket"
)


class Steering:
    """Owns one node's steering: the decision, the read before write, its durable row."""

    def __init__(
        self,
        node: str,
        setting: NodeSetting,
        store: DecisionStore,
        *,
        config: Callable[[], SteeringConfig],
        value_of: Callable[[SteeringConfig, int], str],
        headroom: Callable[[], NodeHeadroom | None],
        held: Callable[[], bool],
        busy: Callable[[], bool],
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.node = node
        self._setting = setting
        self._store = store
        self._config = config
        self._value_of = value_of
        self._headroom = headroom
        self._held = held
        self._busy = busy
        self._wall = wall
        self.row: SteeringRow | None = None
        for row in store.steering_at_open:
            if row[0] != node:
                continue
            if row[1] != setting.target:
                log.warning(
                    "%s: steering: the outbox remembers the %s, not the %s configured now:"
                    " not restored by this scheduler",
                    node,
                    row[1],
                    setting.target,
                )
                continue
            self.row = SteeringRow(*row)
        self.writes: Counter[str] = Counter(dict.fromkeys(RESULTS, 0))
        self.state = "disabled"
        self.detail = ""
        self.value: str | None = None
        self.bucket: int | None = self.row.bucket if self.row is not None else None
        self._read_at: float | None = None  # wall clock of the last read
        self._foreign_seen: str | None = None  # the foreign value warned about
        self._failing = False
        self._last_headroom: NodeHeadroom | None = None
        self._attempt: str | None = None  # the value being written this step
        self._refused: tuple[str | None, str] | None = None  # (value, why): final for it
        self._left_alone: str | None = None  # the unwritable value found and said
        # step() reports its own failures: the poller keeps the cadence, and backs off
        # while the scheduler cannot be reached, doubling up to min_interval_s (a
        # fleet's agents must not all retry a controller coming back every interval).
        cfg = config()
        self.poller = Poller(
            f"{node}: steering",
            self._guarded_step,
            interval_s=lambda: self._config().interval_s,
            backoff=Backoff(cfg.interval_s, max(cfg.interval_s, cfg.min_interval_s)),
            failures=(_Unreachable,),
            on_change=lambda old, new, why: None,
        )

    # ------------------------------------------------------------------ the loop

    async def run(self) -> None:
        """Step every ``interval_s`` (re-read at every step: reloads) until cancelled."""
        await self.poller.run()

    async def _guarded_step(self) -> None:
        try:
            await self.step()
        except Exception:
            # Steering is an opt-in aid: a bug here must not end the agent that
            # protects the node (drains do not depend on this task).
            log.exception("%s: steering step failed", self.node)
            return
        if self._failing:
            raise _Unreachable(self.detail)

    async def step(self) -> None:
        """One look at the headroom, and at most one write (or one restore)."""
        cfg = self._config()
        self._attempt = None
        try:
            if cfg.enabled:
                await self._steer(cfg)
            else:
                await self._restore()
        except SettingChanged as err:
            self._foreign(str(err), None)
        except DeliveryError as err:
            if err.permanent and self._attempt is not None:
                self._refuse(self._attempt, err)
            else:
                self._failed(err)
        except StorageError as err:
            self._failed(err)
        else:
            if self._failing:
                log.info("%s: steering: the %s is reachable again", self.node, self._target)
                self._failing = False

    @property
    def _target(self) -> str:
        return self._setting.target

    # ------------------------------------------------------------------ enabled

    async def _steer(self, cfg: SteeringConfig) -> None:
        h = self._headroom()
        self._last_headroom = h
        if h is None or not h.trusted or h.margin_c is None:
            seen = f"{h.estimated} of {h.gpus} GPU(s)" if h is not None else "no evaluation"
            self._set("untrusted", f"no trusted headroom estimate yet ({seen} estimated)")
            return
        if self._held():
            self._set("held", "out of service by rackguard: the drain keeps new work off")
            return
        if self._busy():
            self._set("waiting", "a decision for this node is being delivered first")
            return
        row = self.row
        # The bucket in force: the one written (durable), else the one last seen in
        # place (a node whose value already was the bucket's: nothing written yet).
        held_bucket = row.bucket if row is not None else self.bucket
        bucket = steer_bucket(h.margin_c, cfg.edges_c, held_bucket, cfg.hysteresis_c)
        want = self._value_of(cfg, bucket)
        self._attempt = None
        if self._refused is not None and self._refused[0] == want:
            self._set("refused", self._refused[1])
            return
        now = self._wall()
        verify_due = self._read_at is None or now - self._read_at >= cfg.min_interval_s
        if not verify_due and self.state in ("left_alone", "foreign"):
            return  # looked at again once per min_interval_s, not every interval
        in_place = row.written if row is not None else self.value
        if in_place == want and not verify_due:
            if self.state != "foreign":
                self._set("steered", f"bucket {bucket}: {want}")
            return
        if row is not None and row.written != want and _too_soon(row, now, cfg):
            self._set("rate_limited", f"bucket {bucket} wants {want}; one write per interval")
            return
        current = await self._setting.read(self.node)
        self.value, self._read_at = current, now
        if row is None and not self._setting.writable(current):
            self._leave_alone(current)
            return
        self._left_alone = None
        if row is not None and row.writing is not None:
            await self._settle_writing(row, current, now)
        if row is not None and not row.ours(current):
            self._foreign(f"{current} since rackguard wrote {row.written}", current)
            return
        self._back_to_ours()
        if current == want:
            self.bucket = bucket
            if row is not None and row.bucket != bucket:
                row.bucket = bucket
                await self._save(row)
            self._set("steered", f"bucket {bucket}: {want}")
            return
        if row is not None and _too_soon(row, now, cfg):
            self._set("rate_limited", f"bucket {bucket} wants {want}; one write per interval")
            return
        if row is None:
            row = SteeringRow(self.node, self._target, original=current)
        row.writing = want
        await self._save(row)  # the original and the write to come, before the write
        self.row = row
        self._attempt = want
        await self._setting.write(self.node, want, current)
        self._attempt = None
        row.written, row.writing, row.written_at, row.bucket = want, None, now, bucket
        self.value, self.bucket = want, bucket
        await self._save(row)
        self.writes["written"] += 1
        log.info(
            "%s: steering: %s %s -> %s (headroom at full load %.1fC, bucket %d)",
            self.node,
            self._target,
            current,
            want,
            h.margin_c,
            bucket,
        )
        self._set("steered", f"bucket {bucket}: {want}")

    # ------------------------------------------------------------------ disabled

    async def _restore(self) -> None:
        row = self.row
        if row is None:
            self._set("disabled", "")
            return
        current = await self._setting.read(self.node)
        self.value, self._read_at = current, self._wall()
        if current == row.original:
            log.info(
                "%s: steering disabled; the %s is its original, %s", self.node, row.target, current
            )
        elif not self._setting.writable(row.original):
            log.warning(
                "%s: steering disabled; the %s's original, %s, is not one rackguard can"
                " write: left at %s",
                self.node,
                row.target,
                row.original,
                current,
            )
        elif row.ours(current):
            if self._refused is not None and self._refused[0] == row.original:
                self._set("refused", self._refused[1])
                return
            self._attempt = row.original
            await self._setting.write(self.node, row.original, current)
            self._attempt = None
            self.value = row.original
            self.writes["restored"] += 1
            log.info(
                "%s: steering disabled; the %s restored to %s (was %s)",
                self.node,
                row.target,
                row.original,
                current,
            )
        else:
            self.writes["foreign"] += 1
            log.warning(
                "%s: steering disabled; the %s is %s, set by someone else since rackguard"
                " wrote %s: left as it is (not restored to %s)",
                self.node,
                row.target,
                current,
                row.written,
                row.original,
            )
        await self._store.write(
            lambda db: db.execute("DELETE FROM steering WHERE node = ?", (self.node,))
        )
        self.row = None
        self.bucket = None
        self._foreign_seen = None
        self._set("disabled", "")

    # ------------------------------------------------------------------ helpers

    async def _save(self, row: SteeringRow) -> None:
        params = row.params()

        def write(db: sqlite3.Connection) -> None:
            db.execute(_UPSERT, params)

        await self._store.write(write)

    def _foreign(self, what: str, value: str | None) -> None:
        row = self.row
        detail = (
            f"the {self._target} is {what}: someone else changed it; left alone until it is"
            f" {row.original if row else '?'} (the original) or rackguard's value again"
        )
        # Once per foreign value (a refused compare-and-set does not say the value).
        seen = self._foreign_seen
        if self.state != "foreign" or (value is not None and seen is not None and value != seen):
            self.writes["foreign"] += 1
            log.warning("%s: steering: %s", self.node, detail)
        if value is not None:
            self._foreign_seen = value
        self._set("foreign", detail)

    def _back_to_ours(self) -> None:
        if self.state == "foreign":
            log.info("%s: steering: the %s is rackguard's again; steering", self.node, self._target)
        self._foreign_seen = None

    async def _settle_writing(self, row: SteeringRow, current: str | None, now: float) -> None:
        """A write started before a crash: record it as written if it landed, else drop it."""
        if current == row.writing:
            row.written, row.written_at = current, now
            log.info("%s: steering: the %s write of %s had landed", self.node, row.target, current)
        row.writing = None
        await self._save(row)

    def _leave_alone(self, value: str | None) -> None:
        detail = (
            f"the {self._target} is {value}, a value rackguard could not write back:"
            " left alone, never overwritten"
        )
        if self._left_alone != value:
            log.warning("%s: steering: %s", self.node, detail)
            self._left_alone = value
        self._set("left_alone", detail)

    def _refuse(self, value: str | None, err: DeliveryError) -> None:
        self.writes["failed"] += 1
        self._attempt = None
        row = self.row
        if row is not None and row.writing == value:
            row.writing = None  # refused: it never landed (kept in memory; the read settles it)
        why = f"the scheduler refused {value} for good: {err}"
        if self._refused is None or self._refused[0] != value:
            log.error("%s: steering: %s (not asked again for this value)", self.node, why)
        self._refused = (value, why)
        self._set("refused", why)

    def _failed(self, err: Exception) -> None:
        self.writes["failed"] += 1
        if not self._failing:
            log.warning("%s: steering: %s (retried, backing off)", self.node, err)
        else:
            log.debug("%s: steering: %s", self.node, err)
        self._failing = True
        self._set("failed", str(err))

    def _set(self, state: str, detail: str) -> None:
        self.state, self.detail = state, detail

    def status(self) -> SteeringStatus:
        """The API's view."""
        cfg = self._config()
        row = self.row
        h = self._last_headroom
        next_at = None
        if row is not None and row.written_at is not None:
            next_at = row.written_at + cfg.min_interval_s
        return SteeringStatus(
            enabled=cfg.enabled,
            node=self.node,
            target=self._target,
            state=self.state,
            detail=self.detail,
            headroom_c=h.margin_c if h is not None else None,
            trusted=h.trusted if h is not None else False,
            bucket=self.bucket,
            value=self.value,
            original=row.original if row is not None else None,
            written=row.written if row is not None else None,
            written_at=row.written_at if row is not None else None,
            next_write_at=next_at,
            writes=dict(self.writes),
        )


def _too_soon(row: SteeringRow, now: float, cfg: SteeringConfig) -> bool:
    return row.written_at is not None and now - row.written_at < cfg.min_interval_s


def build_setting(
    backend: Backend | None, cfg: SteeringConfig
) -> tuple[NodeSetting, Callable[[SteeringConfig, int], str]] | None:
    """The setting steering writes for this backend, and a bucket's value; None: none to steer."""
    setting = backend.node_setting(cfg.label_key) if backend is not None else None
    if setting is None:
        return None
    return setting, lambda c, bucket: setting.value(bucket, c.weights)
