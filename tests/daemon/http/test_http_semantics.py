"""405 says what a resource takes (Allow), OPTIONS is refused alike, HEAD is GET without a body."""

from __future__ import annotations

import aiohttp
import pytest

from daemon.http.openapi import OPENAPI
from tests.support.openapi import check
from tests.support.serving import serving_api


def _paths() -> list[tuple[str, set[str]]]:
    out = []
    for path, ops in OPENAPI["paths"].items():
        declared = {m.upper() for m in ops}
        out.append((path.replace("{name}", "page.js"), declared))
    return out


@pytest.mark.parametrize(("path", "declared"), _paths(), ids=[p for p, _ in _paths()])
async def test_an_undeclared_method_gets_405_with_allow(path: str, declared: set[str]) -> None:
    async with serving_api() as base, aiohttp.ClientSession() as http:
        for method in sorted({"PUT", "DELETE", "PATCH", "TRACE", "OPTIONS", "POST"} - declared):
            async with http.request(method, base + path) as resp:
                assert resp.status == 405, (method, path)
                allow = {m.strip() for m in resp.headers["Allow"].split(",")}
                # What the document declares, and HEAD, which every GET has.
                assert allow == declared | ({"HEAD"} if "GET" in declared else set()), allow
                check("Error", await resp.json())


async def test_head_is_get_without_a_body() -> None:
    async with serving_api() as base, aiohttp.ClientSession() as http:
        async with http.get(base + "/healthz") as got:
            body = await got.read()
        async with http.head(base + "/healthz") as head:
            assert head.status == got.status == 200
            assert head.headers["Content-Type"] == got.headers["Content-Type"]
            assert head.headers["Content-Length"] == str(len(body))
            assert await head.read() == b""
