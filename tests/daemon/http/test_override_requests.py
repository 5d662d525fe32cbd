"""POST /v1/overrides decodes through its typed model: hostile bodies get a 400 naming the field."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import aiohttp
import orjson
import pytest

from daemon.delivery.overrides import OverrideError, OverrideRequest
from daemon.http.api import MAX_BODY_BYTES, ApiContext, make_app
from policies.safety import Pin
from tests.support.openapi import check
from tests.support.serving import serving as serve_app

TOKEN = "req-token"
PIN = {"action": "pin", "node": "n1", "pin": "excluded", "reason": "fans"}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({**PIN, "node": 7}, "node: expected `str`, got `int`"),
        ({**PIN, "reason": ["x"]}, "reason: expected `str`, got `array`"),
        ({**PIN, "actor": {"a": 1}}, "actor: expected `str`, got `object`"),
        ({**PIN, "action": None}, "action: expected `str`, got `null`"),
        ({**PIN, "action": "drain"}, "action: invalid enum value 'drain' (one of: pin, unpin,"),
        ({**PIN, "pin": "sideways"}, "pin: invalid enum value 'sideways' (one of: never_drain,"),
        ({**PIN, "pin": True}, "pin: expected `str | null`, got `bool`"),
        ({**PIN, "pinn": "excluded"}, "pinn: object contains unknown field `pinn` (known: action,"),
        ({"action": "pin", "node": "n1"}, "reason: object missing required field `reason`"),
        ({"reason": "x"}, "action: object missing required field `action`"),
        ({**PIN, "reason": "   "}, "reason: required, so the audit log says why"),
        ({**PIN, "reason": ""}, "reason: expected `str` of length >= 1"),
        ({**PIN, "node": "n" * 257}, "node: expected `str` of length <= 256"),
        ({**PIN, "reason": "r" * 257}, "reason: expected `str` of length <= 256"),
        ({**PIN, "node": "two words"}, "node: required for pin/unpin, a node name without spaces"),
        ({**PIN, "pin": None}, "pin: required for action 'pin', one of never_drain, excluded"),
        ({"action": "unpin", "reason": "x", "node": "n1", "pin": "excluded"}, "pin: not used"),
        ({"action": "reset_storm", "reason": "x", "node": "n1"}, "node: not used with action"),
        ({**PIN, "node": [[[["deep"]]]]}, "node: expected `str`, got `array`"),
        ([PIN], "body: expected `object`, got `array`"),
        ("pin", "body: expected `object`, got `str`"),
        (None, "body: expected `object`, got `null`"),
    ],
)
def test_a_bad_field_is_named(body: Any, message: str) -> None:
    with pytest.raises(OverrideError) as err:
        OverrideRequest.parse(body)
    assert str(err.value).startswith(message), str(err.value)


def test_a_good_body_is_stripped_and_defaulted() -> None:
    req = OverrideRequest.parse({**PIN, "node": " n1 ", "reason": " fans ", "actor": " "})
    assert req == OverrideRequest("pin", "fans", "n1", Pin.EXCLUDED, "operator")
    assert OverrideRequest.parse({"action": "unpin", "node": "n1", "reason": "x", "pin": None})


@contextlib.asynccontextmanager
async def serving() -> AsyncIterator[str]:
    async def never(req: OverrideRequest) -> Any:
        raise AssertionError(f"a hostile body was applied: {req}")

    ctx = ApiContext(
        view=SimpleNamespace(),  # type: ignore[arg-type]
        metrics=SimpleNamespace(),  # type: ignore[arg-type]
        apply_override=never,
        token=TOKEN.encode(),
        reads_need_token=False,
        max_event_streams=1,
    )
    async with serve_app(make_app(ctx)) as base:
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
