"""Operator overrides: pins, a pause of predictive drains, the storm breaker's reset.

Kept in the outbox's SQLite file (the decision store owns the tables and runs
the writes on its thread), so a pin survives a restart, and every change is
written to the audit table that the decision log (GET /v1/decisions) reads
beside the decisions. An override the disk refuses is not applied (StorageError):
the operator is told, rather than a pin silently lost at the next restart.
"""

from __future__ import annotations

import dataclasses
import re
import sqlite3
import time
import typing
from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType
from typing import Annotated, Any, ClassVar, Literal

import msgspec
import orjson
from msgspec import UNSET, Meta, UnsetType

from daemon.clock import UnixTime
from daemon.delivery.outbox import DecisionStore
from policies.codec import to_data
from policies.safety import Overrides, Pin

OverrideAction = Literal["pin", "unpin", "pause_predictive", "resume_predictive", "reset_storm"]
# What a request's texts are stripped of; a reason must hold something else. ASCII
# only, so the pattern means the same to Python's re as to a client's ECMA regex.
# Any other character is taken (the log escapes what it writes).
_BLANK = " \t\n\r\f\v"
_Text = Annotated[str, Meta(max_length=256)]
_Reason = Annotated[
    str,
    Meta(
        min_length=1,
        max_length=256,
        pattern=r"[^ \t\n\r\f\v]",
        description="why, for the audit log (not blank)",
    ),
]
NODE_PATTERN = "^[!-~]+$"  # printable ASCII without spaces: a scheduler's node name
_Node = Annotated[
    str,
    Meta(min_length=1, max_length=256, pattern=NODE_PATTERN, description="the node's name"),
]


class OverrideError(ValueError):
    """A malformed override request; the message names the field."""


# msgspec Structs rather than dataclasses: only a Struct refuses unknown fields
# while decoding (and says so in its schema), so a misspelt ``pinn`` is an error,
# not a pin silently left out. One Struct per action, tagged by ``action``, each
# with exactly the fields it takes: the schema (a oneOf with a discriminator) and
# the decoder are the same definition.
class _Override(
    msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True, tag_field="action"
):
    reason: _Reason
    actor: _Text = "operator"

    @property
    def action(self) -> OverrideAction:
        """The request's tag."""
        return typing.cast(OverrideAction, self.__struct_config__.tag)


class PinRequest(_Override, frozen=True, tag="pin"):
    """Pin a node: never drain it, or keep it excluded."""

    node: _Node
    pin: Pin


class UnpinRequest(_Override, frozen=True, tag="unpin"):
    """Remove a node's pin."""

    node: _Node
    pin: ClassVar[Pin | None] = None


class _NoNode(_Override, frozen=True):
    node: ClassVar[str] = ""
    pin: ClassVar[Pin | None] = None


class PausePredictiveRequest(_NoNode, frozen=True, tag="pause_predictive"):
    """Pause predictive drains (reactive ones go on)."""


class ResumePredictiveRequest(_NoNode, frozen=True, tag="resume_predictive"):
    """Resume predictive drains."""


class ResetStormRequest(_NoNode, frozen=True, tag="reset_storm"):
    """Reset the storm breaker."""


OverrideRequest = (
    PinRequest | UnpinRequest | PausePredictiveRequest | ResumePredictiveRequest | ResetStormRequest
)
REQUEST_TYPES: tuple[type[_Override], ...] = typing.get_args(OverrideRequest)
_BY_ACTION = {str(t.__struct_config__.tag): t for t in REQUEST_TYPES}


def parse_override(body: Any) -> OverrideRequest:
    """Decode and check a JSON-decoded body; OverrideError names the field and the fault."""
    try:
        req: OverrideRequest = msgspec.convert(body, OverrideRequest)
    except msgspec.ValidationError as err:
        raise OverrideError(_field_error(body, str(err))) from None
    if req.node.endswith("\n"):  # Python's ``$`` matches before a final newline, ECMA's not
        raise OverrideError("node: a line break is not part of it")
    actor = req.actor.strip(_BLANK) or "operator"
    return msgspec.structs.replace(req, reason=req.reason.strip(_BLANK), actor=actor)


_AT_FIELD = re.compile(r"(?P<what>.*) - at `\$(?P<path>.*)`")
_NAMED = re.compile(r"field `(?P<name>[^`]*)`")


def _field_error(body: Any, message: str) -> str:
    """msgspec's ``Expected `str`, got `int` - at `$.node``` as ``node: expected `str`, ...``."""
    tag = body.get("action") if isinstance(body, dict) else None
    cls = _BY_ACTION.get(tag) if isinstance(tag, str) else None
    at = _AT_FIELD.fullmatch(message)
    if at is not None:
        what, field = at["what"], at["path"].lstrip(".") or "body"
    else:  # "Object missing required field `reason`", "... contains unknown field `x`"
        named = _NAMED.search(message)
        what, field = message, named["name"] if named else "body"
        if "unknown field" in message and cls is not None:
            known = ", ".join(("action", *cls.__struct_fields__))
            what += f" (action {tag!r} takes: {known})"
    if field == "action" and what.startswith("Invalid value"):
        what += f" (one of: {', '.join(_BY_ACTION)})"
    elif field == "pin" and what.startswith("Invalid enum value"):
        what += f" (one of: {', '.join(p.value for p in Pin)})"
    elif field == "reason" and "matching regex" in what:
        what = "required, so the audit log says why (not blank)"
    what = what.replace("`NoneType`", "`null`")  # the tag's type error names Python's
    return f"{field}: {what[:1].lower()}{what[1:]}"


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
