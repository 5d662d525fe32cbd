"""POST /v1/overrides decodes through its typed model: hostile bodies get a 400 naming the field."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest

from daemon.delivery.overrides import (
    OverrideError,
    PinRequest,
    ResetStormRequest,
    parse_override,
)
from daemon.http.api import MAX_BODY_BYTES
from daemon.http.openapi import OPENAPI
from policies.safety import Pin
from tests.support.openapi import check
from tests.support.serving import serving_api

TOKEN = "req-token"
PIN = {"action": "pin", "node": "n1", "pin": "excluded", "reason": "fans"}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({**PIN, "node": 7}, "node: expected `str`, got `int`"),
        ({**PIN, "reason": ["x"]}, "reason: expected `str`, got `array`"),
        ({**PIN, "actor": {"a": 1}}, "actor: expected `str`, got `object`"),
        ({**PIN, "action": None}, "action: expected `str`, got `null`"),
        ({**PIN, "action": "drain"}, "action: invalid value 'drain' (one of: pin, unpin,"),
        ({**PIN, "pin": "sideways"}, "pin: invalid enum value 'sideways' (one of: never_drain,"),
        ({**PIN, "pin": True}, "pin: expected `str`, got `bool`"),
        ({**PIN, "pinn": "excluded"}, "pinn: object contains unknown field `pinn` (action 'pin'"),
        ({"action": "pin", "node": "n1", "pin": "excluded"}, "reason: object missing required"),
        ({"reason": "x"}, "action: object missing required field `action`"),
        ({**PIN, "reason": "   "}, "reason: required, so the audit log says why"),
        ({**PIN, "reason": ""}, "reason: expected `str` of length >= 1"),
        ({**PIN, "node": "n" * 257}, "node: expected `str` of length <= 256"),
        ({**PIN, "reason": "r" * 257}, "reason: expected `str` of length <= 256"),
        ({**PIN, "node": "two words"}, "node: expected `str` matching regex"),
        ({**PIN, "node": " n1"}, "node: expected `str` matching regex"),
        ({**PIN, "node": "n1\n"}, "node: a line break is not part of it"),
        ({**PIN, "reason": "\t\n \r"}, "reason: required, so the audit log says why"),
        ({**PIN, "node": "gpu-\u00e9"}, "node: expected `str` matching regex"),
        ({**PIN, "pin": None}, "pin: expected `str`, got `null`"),
        ({"action": "pin", "node": "n1", "reason": "x"}, "pin: object missing required field"),
        ({"action": "unpin", "reason": "x"}, "node: object missing required field `node`"),
        (
            {"action": "unpin", "reason": "x", "node": "n1", "pin": "excluded"},
            "pin: object contains unknown field `pin` (action 'unpin' takes: action, node, reason,",
        ),
        ({"action": "reset_storm", "reason": "x", "node": "n1"}, "node: object contains unknown"),
        ({**PIN, "node": [[[["deep"]]]]}, "node: expected `str`, got `array`"),
        ([PIN], "body: expected `object`, got `array`"),
        ("pin", "body: expected `object`, got `str`"),
        (None, "body: expected `object`, got `null`"),
    ],
)
def test_a_bad_field_is_named(body: Any, message: str) -> None:
    with pytest.raises(OverrideError) as err:
        parse_override(body)
    assert str(err.value).startswith(message), str(err.value)


def test_a_good_body_is_stripped_and_defaulted() -> None:
    req = parse_override({**PIN, "reason": " fans ", "actor": " "})
    assert req == PinRequest(node="n1", pin=Pin.EXCLUDED, reason="fans", actor="operator")
    assert (req.action, req.node, req.pin) == ("pin", "n1", Pin.EXCLUDED)
    unpin = parse_override({"action": "unpin", "node": "n1", "reason": "x"})
    assert (unpin.action, unpin.node, unpin.pin) == ("unpin", "n1", None)
    reset = parse_override({"action": "reset_storm", "reason": "x", "actor": "ops"})
    assert reset == ResetStormRequest(reason="x", actor="ops")
    assert (reset.action, reset.node, reset.pin) == ("reset_storm", "", None)


def test_each_action_is_one_branch_of_the_schema_with_exactly_its_fields() -> None:
    schemas = OPENAPI["components"]["schemas"]
    union = schemas["OverrideRequest"]
    mapping = union["discriminator"]["mapping"]
    assert union["discriminator"]["propertyName"] == "action"
    assert [b["$ref"] for b in union["oneOf"]] == list(mapping.values())
    fields = {
        action: set(schemas[ref.rsplit("/", 1)[1]]["properties"]) for action, ref in mapping.items()
    }
    assert fields == {
        "pin": {"action", "node", "pin", "reason", "actor"},
        "unpin": {"action", "node", "reason", "actor"},
        "pause_predictive": {"action", "reason", "actor"},
        "resume_predictive": {"action", "reason", "actor"},
        "reset_storm": {"action", "reason", "actor"},
    }
    for ref in mapping.values():
        assert schemas[ref.rsplit("/", 1)[1]]["additionalProperties"] is False


@contextlib.asynccontextmanager
async def serving() -> AsyncIterator[str]:
    async with serving_api(TOKEN.encode()) as base:
        yield base + "/v1/overrides"


def _chunks(data: bytes) -> Any:
    async def gen() -> AsyncIterator[bytes]:
        for i in range(0, len(data), 4096):
            yield data[i : i + 4096]

    return gen()


DEEP = b'{"action":"pin","reason":"x","node":' + b"[" * 5000 + b"]" * 5000 + b"}"


@pytest.mark.parametrize(
    ("raw", "status", "code", "message"),
    [
        (b'{"action":"pin","reason":"\xff\xfe"}', 400, "bad_json", "body is not JSON: str is not"),
        (b'{"action":"pin","reason":"\\ud800"}', 400, "bad_json", "body is not JSON"),
        (b'{"action":"pin","reason":NaN}', 400, "bad_json", "body is not JSON"),
        (b'{"action":"pin","node":1' + b"0" * 400 + b',"reason":"x"}', 400, "bad_json", ""),
        (b'{"action":"pin","reason":"x"} {}', 400, "bad_json", "body is not JSON"),
        (b"", 400, "bad_json", "body is not JSON"),
        (DEEP, 400, "bad_json", "body is not JSON: depth limit"),
        (b'{"a":' * 3000, 400, "bad_json", "body is not JSON"),
        (orjson.dumps({**PIN, "x": "y" * MAX_BODY_BYTES}), 413, "request_entity_too_large", ""),
        (b'{"action":"pin","reason":"x","node":1e999}', 400, "bad_json", "body is not JSON"),
    ],
    ids=[
        "not-utf8",
        "lone-surrogate",
        "nan",
        "huge-int",
        "trailing",
        "empty",
        "deep-nesting",
        "unclosed-nesting",
        "over-16KiB",
        "infinite-float",
    ],
)
async def test_hostile_bytes_get_a_4xx_in_the_error_shape(
    raw: bytes, status: int, code: str, message: str
) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    async with serving() as url, aiohttp.ClientSession() as http:
        for data in (raw, _chunks(raw)):  # with a length, and chunked without one
            async with http.post(url, data=data, headers=headers) as resp:
                body = await resp.json()
                assert resp.status == status, body
            check("Error", body)
            assert body["error"]["code"] == code
            assert body["error"]["message"].startswith(message), body


async def test_only_json_is_read() -> None:
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "text/plain"}
    async with (
        serving() as url,
        aiohttp.ClientSession() as http,
        http.post(url, data=orjson.dumps(PIN), headers=headers) as resp,
    ):
        assert resp.status == 415
        check("Error", await resp.json())
