"""Operator overrides: pins, a pause of predictive drains, the storm breaker's reset.

Kept in the outbox's SQLite file (the decision store owns the tables and runs
the writes on its thread), so a pin survives a restart, and every change is
written to the audit table that the decision log (GET /v1/decisions) reads
beside the decisions. An override the disk refuses is not applied (StorageError):
the operator is told, rather than a pin silently lost at the next restart.
"""

from __future__ import annotations

import dataclasses
import enum
import re
import sqlite3
import time
import typing
from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType
from typing import Annotated, Any, Literal

import msgspec
import orjson
from msgspec import UNSET, Meta, UnsetType

from daemon.clock import UnixTime
from daemon.delivery.outbox import DecisionStore
from policies.codec import to_data
from policies.safety import Overrides, Pin

OverrideAction = Literal["pin", "unpin", "pause_predictive", "resume_predictive", "reset_storm"]
_Text = Annotated[str, Meta(max_length=256)]


class OverrideError(ValueError):
    """A malformed override request; the message names the field."""


# A msgspec Struct rather than a dataclass: only a Struct refuses unknown fields
# while decoding (and says so in its schema), so a misspelt ``pinn`` is an error,
# not a pin silently left out.
class OverrideRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One POST /v1/overrides body (its schema is derived from this class)."""

    action: OverrideAction
    reason: Annotated[str, Meta(min_length=1, max_length=256)]
    node: _Text = ""
    pin: Pin | None = None
    actor: _Text = "operator"

    @classmethod
    def parse(cls, body: Any) -> OverrideRequest:
        """Decode and check a JSON-decoded body; OverrideError names the field and the fault."""
        try:
            req = msgspec.convert(body, cls)
        except msgspec.ValidationError as err:
            raise OverrideError(_field_error(cls, str(err))) from None
        return req.checked()

    def checked(self) -> OverrideRequest:
        """The request with its texts stripped, once its fields agree with each other."""
        node, reason, actor = self.node.strip(), self.reason.strip(), self.actor.strip()
        if not reason:
            raise OverrideError("reason: required, so the audit log says why")
        if self.action in ("pin", "unpin"):
            if not node or any(c.isspace() for c in node):
                raise OverrideError("node: required for pin/unpin, a node name without spaces")
        elif node:
            raise OverrideError(f"node: not used with action {self.action!r}")
        if self.action == "pin" and self.pin is None:
            choices = ", ".join(p.value for p in Pin)
            raise OverrideError(f"pin: required for action 'pin', one of {choices}")
        if self.action != "pin" and self.pin is not None:
            raise OverrideError(f"pin: not used with action {self.action!r}")
        return msgspec.structs.replace(self, node=node, reason=reason, actor=actor or "operator")


_AT_FIELD = re.compile(r"(?P<what>.*) - at `\$(?P<path>.*)`")
_NAMED = re.compile(r"field `(?P<name>[^`]*)`")


def _field_error(cls: type[msgspec.Struct], message: str) -> str:
    """msgspec's ``Expected `str`, got `int` - at `$.node``` as ``node: expected `str`, ...``."""
    at = _AT_FIELD.fullmatch(message)
    if at is not None:
        what, field = at["what"], at["path"].lstrip(".") or "body"
    else:  # "Object missing required field `reason`", "... contains unknown field `x`"
        named = _NAMED.search(message)
        what, field = message, named["name"] if named else "body"
        if "unknown field" in message:
            what += f" (known: {', '.join(cls.__struct_fields__)})"
    if what.startswith("Invalid enum value"):
        what += f" (one of: {', '.join(_choices(cls, field))})"
    return f"{field}: {what[:1].lower()}{what[1:]}"


def _choices(cls: type, field: str) -> list[str]:
    """The values a Literal or enum field takes."""
    hint = typing.get_type_hints(cls).get(field)
    out: list[str] = []
    for t in (hint, *typing.get_args(hint)):
        if isinstance(t, type) and issubclass(t, enum.Enum):
            out += [m.value for m in t]
        elif typing.get_origin(t) is Literal:
            out += [str(a) for a in typing.get_args(t)]
    return out


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One override as applied and audited: the API's answer and the ``override`` event."""

    id: int | None  # the audit row's
    at: UnixTime
    action: OverrideAction
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
