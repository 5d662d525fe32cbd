"""Query parameters and headers, each request's as one msgspec Struct.

The handler decodes with the Struct and /openapi.json describes the parameters
from the same Struct's JSON schema (:func:`parameters`), so a bound, a pattern or
an enum cannot be in one and not the other. Patterns are ASCII, anchored, and
mean the same to Python's re as to a client's ECMA regex (save Python's ``$``
before a final newline, which :func:`decode` refuses).
"""

from __future__ import annotations

import calendar
import re
from typing import Annotated, Any, Literal, TypeVar

import msgspec
from msgspec import Meta
from multidict import MultiMapping

from daemon.delivery.overrides import NODE_PATTERN
from daemon.http.decision_log import CURSOR_PATTERN, MAX_LIMIT

MAX_EVENT_ID = 10**18 - 1
_SECONDS = r"-?[0-9]{1,12}(\.[0-9]{1,9})?"
_DATE = r"(?P<y>19[7-9][0-9]|2[0-9]{3})-(?P<m>0[1-9]|1[0-2])-(?P<d>0[1-9]|[12][0-9]|3[01])"
_CLOCK = r"(?P<H>[01][0-9]|2[0-3]):(?P<M>[0-5][0-9]):(?P<S>[0-5][0-9](\.[0-9]{1,6})?)"
_OFFSET = r"(?P<z>Z|(?P<sign>[+-])(?P<oh>[01][0-9]|2[0-3]):(?P<om>[0-5][0-9]))"
_RFC3339 = re.compile(f"{_DATE}T{_CLOCK}{_OFFSET}")
# The same without group names, which ECMA spells differently.
TIME_PATTERN = re.sub(r"\?P<\w+>", "", f"^({_SECONDS}|{_RFC3339.pattern})$")
_Node = Annotated[
    str, Meta(min_length=1, max_length=256, pattern=NODE_PATTERN, description="a node's name")
]
_Time = Annotated[
    str,
    Meta(
        max_length=40,
        pattern=TIME_PATTERN,
        description="Unix seconds, or RFC 3339 with its offset (2026-12-05T01:00:00Z)",
    ),
]
# The actions in the log: a decision's (policies.model.Action), a power cap change's
# (policies.power_cap.CapAction) or an override's.
LogAction = Literal[
    "drain", "exclude", "resume",
    "cap", "restore", "release",
    "pin", "unpin", "pause_predictive", "resume_predictive", "reset_storm",
]  # fmt: skip
_EventId = Annotated[int, Meta(ge=0, le=MAX_EVENT_ID)]


class ParamError(ValueError):
    """A bad parameter; the message names it."""


class DecisionQuery(msgspec.Struct, frozen=True, kw_only=True):
    """GET /v1/decisions' query."""

    node: _Node | None = None
    action: (
        Annotated[LogAction, Meta(description="a decision's, a cap change's or an override's")]
        | None
    ) = None
    kind: Literal["decision", "override", "cap"] | None = None
    since: (
        Annotated[_Time, Meta(description="entries at or after it: Unix seconds or RFC 3339")]
        | None
    ) = None
    until: (
        Annotated[_Time, Meta(description="entries before it: Unix seconds or RFC 3339")] | None
    ) = None
    limit: Annotated[int, Meta(ge=1, le=MAX_LIMIT, description="entries per page")] = 100
    cursor: (
        Annotated[
            str,
            Meta(
                max_length=80,
                pattern=CURSOR_PATTERN,
                description="a page's next_cursor, for the page after it",
            ),
        ]
        | None
    ) = None


class EventsQuery(msgspec.Struct, frozen=True, kw_only=True):
    """GET /v1/events' query (``last_event_id`` for clients that cannot set the header)."""

    last_event_id: (
        Annotated[_EventId, Meta(description="resume after this event (as Last-Event-ID)")] | None
    ) = None


class EventsHeaders(
    msgspec.Struct, frozen=True, kw_only=True, rename={"last_event_id": "Last-Event-ID"}
):
    """GET /v1/events' headers."""

    last_event_id: Annotated[_EventId, Meta(description="resume after this event id")] | None = None


_S = TypeVar("_S", bound=msgspec.Struct)
_AT = re.compile(r"(?P<what>.*) - at `\$\.?(?P<name>.*)`")


def decode(values: MultiMapping[str], cls: type[_S]) -> _S:
    """``cls`` from the request's query or headers; ParamError names the parameter.

    A parameter is given once, with a value of its schema; absent is its default.
    """
    raw: dict[str, Any] = {}
    for field in msgspec.structs.fields(cls):
        name = field.encode_name
        given = values.getall(name, [])
        if len(given) > 1:
            raise ParamError(f"{name}: given {len(given)} times, at most once")
        if not given:
            continue
        if given[0].endswith("\n"):  # ``$`` in Python's re, not in ECMA's
            raise ParamError(f"{name}: a line break is not part of any value")
        if not given[0].isascii():  # nor is anything else outside ASCII (bytes aiohttp
            # could not decode arrive as surrogates, which msgspec cannot even read)
            raise ParamError(f"{name}: ASCII only, as its schema says")
        raw[name] = given[0]
    try:
        decoded = msgspec.convert(raw, cls, strict=False)
    except msgspec.ValidationError as err:
        at = _AT.fullmatch(str(err))
        name, what = (at["name"], at["what"]) if at else ("query", str(err))
        what = what.replace(" | null", "")  # absent is none; a value sent is never null
        raise ParamError(f"{name}: {what[:1].lower()}{what[1:]}") from None
    for field in msgspec.structs.fields(cls):
        # msgspec reads "null" as None where None is allowed; None only means absent here.
        if field.encode_name in raw and getattr(decoded, field.name) is None:
            raise ParamError(f"{field.encode_name}: {raw[field.encode_name]!r} is not a value")
    return decoded


def unix_time(value: str | None) -> float | None:
    """A time parameter (TIME_PATTERN) as Unix seconds.

    Every string of the pattern is a time: a day past its month's end (06-31)
    counts on into the next month, as in timegm, rather than a refusal the
    pattern does not announce.
    """
    if value is None:
        return None
    t = _RFC3339.fullmatch(value)
    if t is None:
        return float(value)
    fields = (int(t["y"]), int(t["m"]), int(t["d"]), int(t["H"]), int(t["M"]), 0)
    offset = 0 if t["z"] == "Z" else int(t["oh"]) * 3600 + int(t["om"]) * 60
    return calendar.timegm(fields) + float(t["S"]) - (-offset if t["sign"] == "-" else offset)


def parameters(cls: type[msgspec.Struct], where: Literal["query", "header"]) -> list[Any]:
    """The OpenAPI parameters of ``cls``, from its JSON schema."""
    _, components = msgspec.json.schema_components((cls,), ref_template=_REF)
    schema = components[cls.__name__]
    out = []
    for name, field in schema["properties"].items():
        prop = {k: v for k, v in field.items() if not (k == "default" and v is None)}
        # ``T | None = None``: absent means none; a value sent is never null.
        options = [o for o in prop.pop("anyOf", []) if o != {"type": "null"}]
        if options:
            (only,) = options
            prop = {**only, **prop}
        description = prop.pop("description", "")
        param: dict[str, Any] = {"name": name, "in": where, "required": False, "schema": prop}
        if description:
            param["description"] = description
        out.append(param)
    return out


_REF = "#/components/schemas/{name}"
