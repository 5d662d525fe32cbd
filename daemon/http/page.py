"""The node page at `/`: static files shipped in the package, reading the API in the browser.

No build step and nothing fetched from outside the agent (nodes have no internet):
index.html, page.js and page.css are served from daemon/http/static as they are.
Read-only, like the GET endpoints it reads, and behind the same token off
loopback. The first data (state, assessments, the decision log's first page) is
embedded in index.html as JSON, so the page shows data at its load event —
a screenshot or a reader taken then is not an empty skeleton — and then
follows /v1/events.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from importlib import resources

from aiohttp import web

_STATIC = resources.files(__package__).joinpath("static")
_TYPES = {
    "index.html": "text/html",
    "page.js": "text/javascript",
    "page.css": "text/css",
}
# What /static/{name} serves.
STATIC_FILES = tuple(name for name in _TYPES if name != "index.html")
# The page may load only what the agent itself serves.
_POLICY = "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'"


def _load() -> dict[str, bytes]:
    return {name: _STATIC.joinpath(name).read_bytes() for name in _TYPES}


_SLOT = b"<!--initial-->"


def embed(page: bytes, data: bytes | None) -> bytes:
    """``page`` with ``data`` (JSON) in its slot; ``<`` escaped so no string ends the script."""
    if data is None:
        return page.replace(_SLOT, b"")
    safe = data.replace(b"<", b"\\u003c")
    tag = b'<script id="initial" type="application/json">'
    return page.replace(_SLOT, tag + safe + b"</script>")


def add_page_routes(
    app: web.Application, initial: Callable[[web.Request], Awaitable[bytes | None]]
) -> None:
    """Serve the page at `/` (its first data from ``initial``) and its files under `/static/`."""
    files = _load()

    def respond(name: str, body: bytes | None = None) -> web.Response:
        return web.Response(
            body=files[name] if body is None else body,
            content_type=_TYPES[name],
            charset="utf-8",
            headers={"Content-Security-Policy": _POLICY, "Cache-Control": "no-cache"},
        )

    async def index(request: web.Request) -> web.Response:
        return respond("index.html", embed(files["index.html"], await initial(request)))

    async def static(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in STATIC_FILES:
            raise web.HTTPNotFound(text=f"no static file {name!r}")
        return respond(name)

    app.router.add_get("/", index)
    app.router.add_get("/static/{name}", static)
