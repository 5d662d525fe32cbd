"""Operator overrides: pins, a pause of predictive drains, the storm breaker's reset.

Kept in the outbox's SQLite file (the decision store owns the tables and runs
the writes on its thread), so a pin survives a restart, and every change is
written to the audit table that the decision log (GET /v1/decisions) reads
beside the decisions. An override the disk refuses is not applied (StorageError):
the operator is told, rather than a pin silently lost at the next restart.
"""

from __future__ import annotations

import dataclasses
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import orjson
from msgspec import UNSET, UnsetType

from daemon.delivery.outbox import DecisionStore
from policies.codec import to_data
from policies.safety import Overrides, Pin

ACTIONS = ("pin", "unpin", "pause_predictive", "resume_predictive", "reset_storm")


class OverrideError(ValueError):
    """A malformed override request; the message names the field."""


@dataclass(frozen=True, slots=True)
class OverrideRequest:
    """One validated POST /v1/overrides body."""

    action: str
    node: str = ""
    pin: Pin | None = None
    reason: str = ""
    actor: str = "operator"

    @classmethod
    def parse(cls, body: Any) -> OverrideRequest:
        """Validate a decoded JSON body."""
        if not isinstance(body, dict):
            raise OverrideError("body: must be a JSON object")
        known = {"action", "node", "pin", "reason", "actor"}
        for key in body:
            if key not in known:
                raise OverrideError(f"{key}: unknown field (known: {', '.join(sorted(known))})")
        action = body.get("action")
        if action not in ACTIONS:
            raise OverrideError(f"action: must be one of {', '.join(ACTIONS)}, got {action!r}")
        fields: dict[str, str] = {}
        for key in ("node", "reason", "actor"):
            value = body.get(key, "")
            if not isinstance(value, str) or len(value) > 256:
                raise OverrideError(f"{key}: must be a string of at most 256 characters")
            fields[key] = value.strip()
        if not fields["reason"]:
            raise OverrideError("reason: required, so the audit log says why")
        node = fields["node"]
        pin = None
        if action in ("pin", "unpin"):
            if not node or any(c.isspace() for c in node):
                raise OverrideError("node: required for pin/unpin, a node name without spaces")
        elif node:
            raise OverrideError(f"node: not used with action {action!r}")
        if action == "pin":
            raw = body.get("pin")
            if raw not in {p.value for p in Pin}:
                choices = ", ".join(p.value for p in Pin)
                raise OverrideError(f"pin: must be one of {choices}, got {raw!r}")
            pin = Pin(raw)
        elif "pin" in body:
            raise OverrideError(f"pin: not used with action {action!r}")
        return cls(action, node, pin, fields["reason"], fields["actor"] or "operator")


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One override as applied and audited: the API's answer and the ``override`` event."""

    id: int | None  # the audit row's
    at: float  # wall clock
    action: str
    node: str
    reason: str
    actor: str
    pin: Pin | UnsetType = UNSET  # a pin's

    def record(self) -> dict[str, Any]:
        """The audit row's body (the decision log's ``override``): the entry less id and at."""
        data: dict[str, Any] = to_data(self)
        del data["id"], data["at"]
        return data


class OverrideStore:
    """The current overrides, persisted, with an audit trail."""

    def __init__(
        self,
        store: DecisionStore,
        *,
        wall: Callable[[], float] = time.time,
        mono: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._wall = wall
        self._mono = mono
        self.pins: dict[str, tuple[Pin, str]] = {}
        self.paused: tuple[bool, str] = (False, "")
        self._storm_reset_at: float | None = None
        for key, body in store.overrides_at_open:
            data = orjson.loads(body)
            if key.startswith("pin:"):
                self.pins[key[4:]] = (Pin(data["pin"]), data["reason"])
            elif key == "paused":
                self.paused = (bool(data["paused"]), data["reason"])

    async def apply(self, req: OverrideRequest) -> AuditEntry:
        """Apply one request, persist it and audit it; returns the audit entry.

        Raises StorageError (nothing applied) when the disk refuses the write.
        """
        pin = UNSET if req.pin is None else req.pin
        entry = AuditEntry(None, self._wall(), req.action, req.node, req.reason, req.actor, pin)
        pins = dict(self.pins)
        paused = self.paused
        if req.action == "pin" and req.pin is not None:
            pins[req.node] = (req.pin, req.reason)
        elif req.action == "unpin":
            pins.pop(req.node, None)
        elif req.action in ("pause_predictive", "resume_predictive"):
            paused = (req.action == "pause_predictive", req.reason)

        def write(db: sqlite3.Connection) -> int | None:
            if req.action == "pin" and req.pin is not None:
                self._put(db, f"pin:{req.node}", {"pin": req.pin.value, "reason": req.reason})
            elif req.action == "unpin":
                db.execute("DELETE FROM overrides WHERE key = ?", (f"pin:{req.node}",))
            elif req.action in ("pause_predictive", "resume_predictive"):
                self._put(db, "paused", {"paused": paused[0], "reason": req.reason})
            cur = db.execute(
                "INSERT INTO audit (at, actor, action, node, reason, body) VALUES (?,?,?,?,?,?)",
                (
                    entry.at,
                    req.actor,
                    req.action,
                    req.node,
                    req.reason,
                    orjson.dumps(entry.record()),
                ),
            )
            return cur.lastrowid

        ident = await self._store.write(write)
        # Only what was committed reaches the policy.
        self.pins, self.paused = pins, paused
        if req.action == "reset_storm":
            self._storm_reset_at = self._mono()
        return dataclasses.replace(entry, id=ident)

    @staticmethod
    def _put(db: sqlite3.Connection, key: str, value: dict[str, Any]) -> None:
        db.execute(
            "INSERT INTO overrides (key, body) VALUES (?, ?) "
            "ON CONFLICT(key) DO UPDATE SET body = excluded.body",
            (key, orjson.dumps(value)),
        )

    def to_policy(self) -> Overrides:
        """The pure policy's view."""
        return Overrides(
            pins=MappingProxyType({node: pin for node, (pin, _) in self.pins.items()}),
            predictive_paused=self.paused[0],
            storm_reset_at=self._storm_reset_at,
        )
