"""A fake slurmrestd (Slurm >= 23.02 REST write path) on loopback.

It reproduces the exchanges recorded from a real Slurm 24.11 in
``shared/data/slurm/slurmrestd-24.11-transcript.txt``: node state lists
(["IDLE", "DRAIN"]), ``{"errors": [], "warnings": []}`` on success, HTTP 500
with error 2018 (unknown node), 2028 (invalid state, e.g. RESUME of a node that
is neither drained nor down), 9207 + 2028 (an unknown state word), 2010 (a user
who is not an administrator), 401 ``Authentication failure`` without a token
and 511 with a bad one; RESUME keeps the reason and leaves NOT_RESPONDING set
for a moment. Versions below v0.0.39 answer a node POST with 405, like 22.05.

Every accepted write is recorded (``writes``) with the state before and after,
so tests can assert that nothing was applied twice.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

USER = web.RequestKey("user", str)
KNOWN_STATES = {"DRAIN", "RESUME", "DOWN", "UNDRAIN", "IDLE", "FAIL"}


def expand_hostlist(expr: str) -> list[str]:
    """``gpu[02-03,05]`` -> gpu02, gpu03, gpu05 (one bracket group, as Slurm writes them)."""
    m = re.fullmatch(r"([^\[\]]*)\[([^\]]+)\]([^\[\]]*)", expr)
    if not m:
        return [n for n in expr.split(",") if n]
    prefix, body, suffix = m.groups()
    out: list[str] = []
    for part in body.split(","):
        lo, _, hi = part.partition("-")
        width = len(lo)
        for i in range(int(lo), int(hi or lo) + 1):
            out.append(f"{prefix}{i:0{width}d}{suffix}")
    return out


@dataclass
class FakeNode:
    """One node as slurmctld holds it."""

    name: str
    base: str = "IDLE"  # IDLE or DOWN
    flags: list[str] = field(default_factory=list)
    reason: str = ""
    reason_set_by_user: str = "root"
    not_responding_until: float = 0.0
    features: list[str] = field(default_factory=list)  # e.g. ["rack_a"]: the node's rack
    reason_changed_at: int = 0  # wall seconds; 0: never set

    def states(self, now: float) -> list[str]:
        """Base state then flags, as v0.0.40+ report them."""
        extra = ["NOT_RESPONDING"] if now < self.not_responding_until else []
        return [self.base, *self.flags, *extra]

    def held(self) -> str:
        """A compact form for the write log: IDLE, IDLE+DRAIN, DOWN, ..."""
        return "+".join([self.base, *self.flags])


@dataclass(frozen=True, slots=True)
class Write:
    """One node update slurmctld accepted."""

    node: str
    state: str
    reason: str | None
    before: str
    after: str
    user: str
    at: float


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.lstrip("v").split("."))


def _errors(*items: tuple[str, int, str]) -> dict[str, Any]:
    return {
        "errors": [{"error": e, "error_number": n, "description": d} for e, n, d in items],
        "warnings": [],
    }


class FakeSlurmrestd:
    """slurmrestd + slurmctld node state, with fault controls."""

    def __init__(
        self,
        nodes: Iterable[str] = ("gpu01", "gpu02", "gpu03", "gpu04"),
        *,
        versions: Iterable[str] = ("v0.0.40", "v0.0.41", "v0.0.42"),
        tokens: dict[str, str] | None = None,
        admins: Iterable[str] = ("root",),
        resume_settle_s: float = 0.0,
        racks: dict[str, str] | None = None,
    ) -> None:
        # ``racks``: node -> rack, served as the node feature ``rack_<rack>``.
        self.nodes = {n: FakeNode(n) for n in nodes}
        for name, rack in (racks or {}).items():
            self.nodes[name].features = [f"rack_{rack}"]
        self.versions = tuple(sorted(versions, key=_version_tuple))
        self.tokens = dict(tokens or {"root": "token-root"})
        self.admins = set(admins)
        self.resume_settle_s = resume_settle_s
        self.writes: list[Write] = []
        self.requests: list[tuple[str, str]] = []
        self.auth_failures = 0
        # Fault controls: answer this status to the next N requests.
        self.fail_next = 0
        self.fail_body: dict[str, Any] | None = None  # JSON body of injected failures
        self.fail_status = 503
        # ... or answer the next N node updates 200 without applying them (a lying server).
        self.drop_writes = 0
        # ... or apply the next N node updates but answer only after this many seconds.
        self.slow_writes = 0
        self.slow_write_s = 30.0
        self._runner: web.AppRunner | None = None
        self.port = 0
        self.url = ""

    # ------------------------------------------------------------------ control

    async def start(self, port: int | None = None) -> str:
        """Serve on 127.0.0.1 (the same port again after stop(), unless told otherwise)."""
        app = web.Application()
        app.router.add_get("/openapi/v3", self._openapi)
        app.router.add_get("/slurm/{version}/ping", self._ping)
        app.router.add_get("/slurm/{version}/nodes", self._get_nodes)
        app.router.add_get("/slurm/{version}/node/{name}", self._get_node)
        app.router.add_post("/slurm/{version}/node/{name}", self._post_node)
        app.router.add_post("/slurm/{version}/nodes", self._post_nodes)
        app.middlewares.append(self._middleware)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port if port is None else port)
        await site.start()
        self.port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{self.port}"
        return self.url

    async def stop(self) -> None:
        """Stop serving: connections are refused until start() again."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def admin_drain(self, node: str, reason: str, user: str = "admin") -> None:
        """An administrator's own drain, as ``scontrol update`` would make it."""
        n = self.nodes[node]
        if "DRAIN" not in n.flags:
            n.flags.append("DRAIN")
        n.reason, n.reason_set_by_user = reason, user
        n.reason_changed_at = int(time.time())

    def admin_resume(self, node: str) -> None:
        """An administrator resumes the node by hand."""
        n = self.nodes[node]
        n.base, n.flags = "IDLE", [f for f in n.flags if f != "DRAIN"]

    # ------------------------------------------------------------------ HTTP

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.requests.append((request.method, request.path))
        if self.fail_next > 0:
            self.fail_next -= 1
            if self.fail_body is not None:
                return web.json_response(self.fail_body, status=self.fail_status)
            return web.Response(status=self.fail_status, text="injected failure")
        user = request.headers.get("X-SLURM-USER-NAME", "")
        token = request.headers.get("X-SLURM-USER-TOKEN", "")
        bearer = request.headers.get("Authorization", "")
        if bearer.startswith("Bearer "):
            token = bearer.removeprefix("Bearer ")
            user = next((u for u, t in self.tokens.items() if t == token), "")
        if not token:
            self.auth_failures += 1
            return web.Response(status=401, text="Authentication failure")
        if self.tokens.get(user) != token:
            self.auth_failures += 1
            return web.Response(status=511)
        request[USER] = user
        resp: web.StreamResponse = await handler(request)
        return resp

    def _check_version(self, request: web.Request) -> str:
        version = request.match_info["version"]
        if version not in self.versions:
            raise web.HTTPNotFound(text=f"Unable to find path for {request.path}")
        return version

    def _node_json(self, node: FakeNode, version: str) -> dict[str, Any]:
        states = node.states(time.monotonic())
        out: dict[str, Any] = {
            "name": node.name,
            "reason": node.reason,
            "reason_set_by_user": node.reason_set_by_user,
            "features": node.features,
        }
        if _version_tuple(version) >= (0, 0, 39):
            out["state"] = states
            at = node.reason_changed_at
            out["reason_changed_at"] = {"set": at > 0, "infinite": False, "number": at}
        else:
            out["reason_changed_at"] = node.reason_changed_at
            out["state"] = states[0].lower()
            out["state_flags"] = states[1:]
        return out

    @staticmethod
    def _json(body: Any, status: int = 200) -> web.Response:
        return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")

    async def _openapi(self, request: web.Request) -> web.Response:
        paths: dict[str, Any] = {}
        for v in self.versions:
            paths[f"/slurm/{v}/ping"] = {"get": {}}
            paths[f"/slurm/{v}/nodes"] = {"get": {}}
            node: dict[str, Any] = {"get": {}}
            if _version_tuple(v) >= (0, 0, 39):
                node["post"] = {}
                node["delete"] = {}
                paths[f"/slurm/{v}/nodes"]["post"] = {}
            paths[f"/slurm/{v}/node/{{node_name}}"] = node
        return self._json({"openapi": "3.0.2", "paths": paths})

    async def _ping(self, request: web.Request) -> web.Response:
        self._check_version(request)
        return self._json({"pings": [{"hostname": "fake", "pinged": "UP"}], "errors": []})

    async def _get_nodes(self, request: web.Request) -> web.Response:
        version = self._check_version(request)
        nodes = [self._node_json(n, version) for n in self.nodes.values()]
        return self._json({"nodes": nodes, "errors": [], "warnings": []})

    async def _get_node(self, request: web.Request) -> web.Response:
        version = self._check_version(request)
        name = request.match_info["name"]
        if name not in self.nodes:
            body = _errors(("Invalid node name specified", 2018, f"Failure to query node {name}"))
            return self._json({**body, "nodes": []}, 500)
        return self._json({"nodes": [self._node_json(self.nodes[name], version)], "errors": []})

    async def _post_node(self, request: web.Request) -> web.Response:
        version = self._check_version(request)
        if _version_tuple(version) < (0, 0, 39):
            return web.Response(
                status=405,
                text="Requested REST method is not defined at URL. "
                "Please view /openapi/v3 for API reference.",
            )
        body = orjson.loads(await request.read())
        resp = self._update([request.match_info["name"]], body, request[USER])
        if self.slow_writes > 0:
            self.slow_writes -= 1
            await asyncio.sleep(self.slow_write_s)
        return resp

    async def _post_nodes(self, request: web.Request) -> web.Response:
        self._check_version(request)
        body = orjson.loads(await request.read())
        names = expand_hostlist(str(body.get("name", "")))
        resp = self._update(names, body, request[USER])
        if resp.status == 200:
            warning = (
                "Expected OpenAPI type=array (Slurm type=list) but got OpenAPI type=string "
                f'(Slurm type=string): "{body.get("name", "")}"'
            )
            return self._json({"errors": [], "warnings": [warning]})
        return resp

    def _update(self, names: list[str], body: dict[str, Any], user: str) -> web.Response:
        states = [str(s).upper() for s in body.get("state") or []]
        reason = body.get("reason")
        for name in names:
            if name not in self.nodes:
                failure = f"Failure to update node {name}"
                return self._json(_errors(("Invalid node name specified", 2018, failure)), 500)
            failure = f"Failure to update node {name}"
            unknown = [s for s in states if s not in KNOWN_STATES]
            if unknown:
                return self._json(
                    _errors(
                        (
                            "Data parser unable to parse invalid flag",
                            9207,
                            f'Unknown flag "{unknown[0]}"',
                        ),
                        ("Invalid node state specified", 2028, failure),
                    ),
                    500,
                )
            if user not in self.admins:
                return self._json(_errors(("Invalid user id", 2010, failure)), 500)
            node = self.nodes[name]
            if "RESUME" in states and "DRAIN" not in node.flags and node.base != "DOWN":
                return self._json(_errors(("Invalid node state specified", 2028, failure)), 500)
        if self.drop_writes > 0:
            self.drop_writes -= 1
            return self._json({"errors": [], "warnings": []})
        now = time.monotonic()
        for name in names:
            node = self.nodes[name]
            before = node.held()
            for state in states:
                if state == "DRAIN":
                    if "DRAIN" not in node.flags:
                        node.flags.append("DRAIN")
                elif state == "DOWN":
                    node.base = "DOWN"
                elif state in ("RESUME", "UNDRAIN"):
                    was_drained = "DRAIN" in node.flags
                    node.flags = [f for f in node.flags if f != "DRAIN"]
                    if state == "RESUME":
                        node.base = "IDLE"
                    if was_drained:
                        node.not_responding_until = now + self.resume_settle_s
            if reason is not None and not any(s in ("RESUME", "UNDRAIN") for s in states):
                node.reason, node.reason_set_by_user = str(reason), user
                node.reason_changed_at = int(time.time())
            self.writes.append(
                Write(name, "+".join(states), reason, before, node.held(), user, time.time())
            )
        return self._json({"errors": [], "warnings": []})
