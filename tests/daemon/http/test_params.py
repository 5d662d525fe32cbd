"""Query parameters and headers decode through one model each, the one the document shows."""

from __future__ import annotations

import re

import msgspec
import pytest
from multidict import CIMultiDict, MultiDict
from yarl import URL

from daemon.http.decision_log import decode_cursor, encode_cursor
from daemon.http.openapi import OPENAPI
from daemon.http.params import (
    TIME_PATTERN,
    DecisionQuery,
    EventsHeaders,
    ParamError,
    decode,
    unix_time,
)


def _decisions_parameters() -> dict[str, dict[str, object]]:
    params = OPENAPI["paths"]["/v1/decisions"]["get"]["parameters"]
    return {p["name"]: p["schema"] for p in params}


def test_the_document_shows_the_bounds_the_handler_decodes_with() -> None:
    shown = _decisions_parameters()
    assert set(shown) == {f.name for f in msgspec.structs.fields(DecisionQuery)}
    assert shown["limit"] == {"type": "integer", "minimum": 1, "maximum": 500, "default": 100}
    assert shown["kind"] == {"enum": ["cap", "decision", "override"]}
    assert shown["since"]["pattern"] == TIME_PATTERN
    assert "pattern" in shown["cursor"] and "pattern" in shown["node"]


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("limit=0", "limit: expected `int` >= 1"),
        ("limit=501", "limit: expected `int` <= 500"),
        ("limit=" + "9" * 5000, "limit: integer value out of range"),
        ("limit=", "limit: expected `int`, got `str`"),
        ("limit=1&limit=2", "limit: given 2 times, at most once"),
        ("kind=null", "kind: 'null' is not a value"),
        ("kind=other", "kind: invalid enum value 'other'"),
        ("action=drain%0A", "action: a line break is not part of any value"),
        ("node=gpu%C3%A9", "node: ASCII only"),
        ("node=", "node: expected `str` of length >= 1"),
        ("since=yesterday", "since: expected `str` matching regex"),
        ("since=2026-12-05T01:00:00", "since: expected `str` matching regex"),  # no offset
        ("cursor=WzE3OTAwMDAwMDAuMjUsIm92ZXJyaWRlIiwxXQ", "cursor: expected `str` matching"),
    ],
)
def test_a_bad_parameter_is_named(query: str, message: str) -> None:
    with pytest.raises(ParamError) as err:
        decode(MultiDict(URL("/?" + query).query), DecisionQuery)
    assert str(err.value).startswith(message), str(err.value)


def test_good_parameters_decode() -> None:
    q = decode(MultiDict(limit="7", kind="override", cursor="1.5_decision_3"), DecisionQuery)
    assert (q.limit, q.kind, q.cursor, q.node) == (7, "override", "1.5_decision_3", None)
    headers = decode(CIMultiDict({"last-event-id": "12"}), EventsHeaders)
    assert headers.last_event_id == 12


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("1700000000", 1700000000.0),
        ("-5.25", -5.25),
        ("2100-01-01T00:00:00Z", 4102444800.0),
        ("2026-12-05T01:00:00.5+01:30", 1796427000.5),
        ("2026-12-05T01:00:00-05:00", 1796450400.0),
        # Every string of the pattern is a time: June 31 is July 1, as timegm has it.
        ("2070-06-31T00:00:00Z", unix_time("2070-07-01T00:00:00Z")),
    ],
)
def test_every_time_of_the_pattern_is_a_time(value: str, seconds: float) -> None:
    assert re.fullmatch(TIME_PATTERN, value)
    assert unix_time(value) == seconds


@pytest.mark.parametrize("at", [1733360000.1234567, 0.0, 1e16, 5e-324, -3.5, 1.5e300])
def test_a_cursor_round_trips_and_matches_its_pattern(at: float) -> None:
    cursor = encode_cursor(at, "override", 42)
    schema = _decisions_parameters()["cursor"]
    assert isinstance(schema["pattern"], str) and re.fullmatch(schema["pattern"], cursor)
    assert decode_cursor(cursor) == (at, "override", 42)


def test_any_cursor_of_the_pattern_is_a_position() -> None:
    assert decode_cursor("802e-798_decision_017") == (0.0, "decision", 17)
    assert decode_cursor("9" * 20 + "_override_" + "9" * 18)[2] == 10**18 - 1
