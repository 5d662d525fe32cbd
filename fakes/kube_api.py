"""A fake Kubernetes API server (nodes, pods, evictions, events) on loopback.

It enforces the semantics a careless client gets wrong:

- every change bumps ``metadata.resourceVersion``; a patch whose result names
  a different resourceVersion than the stored one is 409 Conflict;
- JSON Patch (RFC 6902) is applied all-or-nothing: a failed ``test`` or a bad
  path is 422 and changes nothing;
- merge patches (JSON merge and strategic merge) replace lists whole:
  ``spec.taints`` has no patch merge key, so a patch carrying one taint drops
  every other;
- the policy/v1 Eviction API answers 429 while a PodDisruptionBudget allows no
  disruption;
- a missing or wrong bearer token is 401.

Fault controls: ``race_next_patch`` changes the node (adds a taint of its own)
just before the next PATCH is applied, as another controller would.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web


class PatchFailed(Exception):
    """A JSON Patch could not be applied (test failed, bad path)."""


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _walk(doc: Any, pointer: str) -> tuple[Any, str]:
    """The container holding the pointer's last segment, and that segment."""
    if not pointer.startswith("/"):
        raise PatchFailed(f"bad JSON pointer {pointer!r}")
    parts = [_unescape(p) for p in pointer[1:].split("/")]
    cur = doc
    for p in parts[:-1]:
        if isinstance(cur, dict) and p in cur:
            cur = cur[p]
        elif isinstance(cur, list) and p.isdigit() and int(p) < len(cur):
            cur = cur[int(p)]
        else:
            raise PatchFailed(f"path {pointer!r} does not exist")
    return cur, parts[-1]


def json_patch(doc: Any, ops: list[dict[str, Any]]) -> Any:
    """Apply RFC 6902 operations (add, remove, replace, test) to a copy of ``doc``."""
    out = copy.deepcopy(doc)
    for op in ops:
        kind, path = op.get("op"), str(op.get("path", ""))
        parent, key = _walk(out, path)
        if kind == "test":
            actual = parent.get(key) if isinstance(parent, dict) else None
            if actual != op.get("value"):
                raise PatchFailed(f"Testing value {path} failed")
        elif kind in ("add", "replace"):
            if isinstance(parent, dict):
                if kind == "replace" and key not in parent:
                    raise PatchFailed(f"replace operation does not apply: {path} is missing")
                parent[key] = copy.deepcopy(op["value"])
            elif isinstance(parent, list):
                idx = len(parent) if key == "-" else int(key)
                if kind == "add":
                    parent.insert(idx, copy.deepcopy(op["value"]))
                else:
                    parent[idx] = copy.deepcopy(op["value"])
            else:
                raise PatchFailed(f"path {path!r} does not exist")
        elif kind == "remove":
            if isinstance(parent, dict) and key in parent:
                del parent[key]
            elif isinstance(parent, list) and key.isdigit() and int(key) < len(parent):
                del parent[int(key)]
            else:
                raise PatchFailed(f"remove operation does not apply: {path} is missing")
        else:
            raise PatchFailed(f"unsupported op {kind!r}")
    return out


def merge_patch(doc: Any, patch: Any) -> Any:
    """RFC 7386: maps merge, null deletes, lists (taints included) are replaced whole."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(doc) if isinstance(doc, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    return web.Response(body=orjson.dumps(body), status=code, content_type="application/json")


@dataclass
class Budget:
    """A PodDisruptionBudget over pods carrying ``label``: how many may go now."""

    label: tuple[str, str]
    disruptions_allowed: int


@dataclass
class FakeKubeApi:
    """Nodes, pods, budgets and events of a small cluster."""

    token: str = "test-token"
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    budgets: list[Budget] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    patches: list[tuple[str, str, Any]] = field(default_factory=list)  # node, type, body
    evictions: list[tuple[str, str, int]] = field(default_factory=list)  # ns, pod, status
    race_next_patch: int = 0  # change the node before the next N patches
    forbid_patch: bool = False  # RBAC: the account may not patch nodes
    resource_version: int = 100
    url: str = ""
    _runner: web.AppRunner | None = None

    # ------------------------------------------------------------------ fixtures

    def _bump(self) -> str:
        self.resource_version += 1
        return str(self.resource_version)

    def add_node(
        self, name: str, *, taints: Iterable[dict[str, Any]] = (), unschedulable: bool = False
    ) -> None:
        """A node as the kubelet registers it."""
        spec: dict[str, Any] = {"podCIDR": "10.0.0.0/24"}
        if taints:
            spec["taints"] = list(taints)
        if unschedulable:
            spec["unschedulable"] = True
        self.nodes[name] = {
            "kind": "Node",
            "apiVersion": "v1",
            "metadata": {
                "name": name,
                "uid": f"uid-{name}",
                "resourceVersion": self._bump(),
                "labels": {"kubernetes.io/hostname": name},
                "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
            },
            "spec": spec,
        }

    def add_pod(
        self,
        namespace: str,
        name: str,
        node: str,
        *,
        labels: dict[str, str] | None = None,
        daemonset: bool = False,
    ) -> None:
        """A running pod bound to ``node``."""
        meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels or {}}
        if daemonset:
            meta["ownerReferences"] = [{"kind": "DaemonSet", "name": "ds", "controller": True}]
        self.pods[(namespace, name)] = {
            "metadata": meta,
            "spec": {"nodeName": node},
            "status": {"phase": "Running"},
        }

    def edit_node(self, name: str, patch: dict[str, Any]) -> None:
        """Someone else changes the node (a merge patch, lists replaced whole)."""
        node = merge_patch(self.nodes[name], patch)
        node["metadata"]["resourceVersion"] = self._bump()
        self.nodes[name] = node

    # ------------------------------------------------------------------ server

    async def start(self) -> str:
        """Serve on a free loopback port; returns the base URL."""
        app = web.Application(middlewares=[self._auth])
        app.router.add_get("/api/v1/nodes", self._list_nodes)
        app.router.add_get("/api/v1/nodes/{name}", self._get_node)
        app.router.add_patch("/api/v1/nodes/{name}", self._patch_node)
        app.router.add_get("/api/v1/pods", self._list_pods)
        app.router.add_post("/api/v1/namespaces/{ns}/pods/{name}/eviction", self._evict)
        app.router.add_post("/api/v1/namespaces/{ns}/events", self._event)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self.url

    async def stop(self) -> None:
        """Stop serving."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return _status(401, "Unauthorized", "Unauthorized")
        resp: web.StreamResponse = await handler(request)
        return resp

    @staticmethod
    def _json(body: Any, status: int = 200) -> web.Response:
        return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")

    async def _list_nodes(self, request: web.Request) -> web.Response:
        return self._json({"kind": "NodeList", "items": list(self.nodes.values())})

    async def _get_node(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in self.nodes:
            return _status(404, "NotFound", f'nodes "{name}" not found')
        return self._json(self.nodes[name])

    async def _patch_node(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in self.nodes:
            return _status(404, "NotFound", f'nodes "{name}" not found')
        if self.forbid_patch:
            return _status(
                403,
                "Forbidden",
                f'nodes "{name}" is forbidden: User "system:serviceaccount:kube-system:rackguard" '
                'cannot patch resource "nodes" in API group "" at the cluster scope',
            )
        ctype = request.headers.get("Content-Type", "").split(";")[0].strip()
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return _status(400, "BadRequest", "invalid JSON in patch")
        self.patches.append((name, ctype, body))
        if self.race_next_patch > 0:
            self.race_next_patch -= 1
            taints = [*self.nodes[name]["spec"].get("taints", [])]
            taints.append(
                {"key": f"other.io/racer-{self.resource_version}", "effect": "NoSchedule"}
            )
            self.edit_node(name, {"spec": {"taints": taints}})
        current = self.nodes[name]
        try:
            if ctype == "application/json-patch+json":
                if not isinstance(body, list):
                    return _status(400, "BadRequest", "a JSON Patch must be an array")
                patched = json_patch(current, body)
            elif ctype in (
                "application/merge-patch+json",
                "application/strategic-merge-patch+json",
            ):
                patched = merge_patch(current, body)
            else:
                return _status(415, "UnsupportedMediaType", f"unsupported patch type {ctype!r}")
        except PatchFailed as err:
            return _status(422, "Invalid", str(err))
        stored = current["metadata"]["resourceVersion"]
        if patched.get("metadata", {}).get("resourceVersion") != stored:
            return _status(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on nodes "{name}": the object has been modified; '
                "please apply your changes to the latest version and try again",
            )
        if patched.get("metadata", {}).get("name") != name:
            return _status(422, "Invalid", "metadata.name is immutable")
        patched["metadata"]["resourceVersion"] = self._bump()
        self.nodes[name] = patched
        return self._json(patched)

    async def _list_pods(self, request: web.Request) -> web.Response:
        selector = request.query.get("fieldSelector", "")
        items = list(self.pods.values())
        if selector.startswith("spec.nodeName="):
            node = selector.removeprefix("spec.nodeName=")
            items = [p for p in items if p["spec"]["nodeName"] == node]
        return self._json({"kind": "PodList", "items": items})

    async def _evict(self, request: web.Request) -> web.Response:
        ns, name = request.match_info["ns"], request.match_info["name"]
        body = orjson.loads(await request.read())
        if body.get("kind") != "Eviction" or body.get("apiVersion") != "policy/v1":
            return _status(400, "BadRequest", "expected a policy/v1 Eviction")
        pod = self.pods.get((ns, name))
        if pod is None:
            self.evictions.append((ns, name, 404))
            return _status(404, "NotFound", f'pods "{name}" not found')
        labels = pod["metadata"].get("labels", {})
        for budget in self.budgets:
            k, v = budget.label
            if labels.get(k) == v:
                if budget.disruptions_allowed <= 0:
                    self.evictions.append((ns, name, 429))
                    return _status(
                        429,
                        "TooManyRequests",
                        "Cannot evict pod as it would violate the pod's disruption budget.",
                    )
                budget.disruptions_allowed -= 1
        del self.pods[(ns, name)]
        self.evictions.append((ns, name, 201))
        return self._json({"kind": "Status", "status": "Success", "code": 201}, 201)

    async def _event(self, request: web.Request) -> web.Response:
        event = orjson.loads(await request.read())
        event.setdefault("metadata", {})["name"] = f"rackguard-{len(self.events)}"
        self.events.append(event)
        return self._json(event, 201)
