"""The reference server for the API bench: aiohttp on uvloop returning fixed bytes."""

from __future__ import annotations

import sys
from pathlib import Path

import uvloop
from aiohttp import web


def main() -> None:
    """`python -m bench.api_bare PORT BODY_FILE`."""
    port, body_file = int(sys.argv[1]), Path(sys.argv[2])
    body = body_file.read_bytes()

    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.router.add_get("/v1/state", handler)
    uvloop.install()
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


if __name__ == "__main__":
    main()
