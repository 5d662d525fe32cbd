"""The node page at `/`: static files shipped in the package, reading the API in the browser.

No build step and nothing fetched from outside the agent (nodes have no internet):
index.html, page.js and page.css are served from daemon/http/static as they are.
Read-only, like the GET endpoints it reads; no token.
"""

from __future__ import annotations

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


def add_page_routes(app: web.Application) -> None:
    """Serve the page at `/` and its files under `/static/`."""
    files = _load()

    def respond(name: str) -> web.Response:
        return web.Response(
            body=files[name],
            content_type=_TYPES[name],
            charset="utf-8",
            headers={"Content-Security-Policy": _POLICY, "Cache-Control": "no-cache"},
        )

    async def index(request: web.Request) -> web.Response:
        return respond("index.html")

    async def static(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in STATIC_FILES:
            raise web.HTTPNotFound(text=f"no static file {name!r}")
        return respond(name)

    app.router.add_get("/", index)
    app.router.add_get("/static/{name}", static)
