"""A fake Kubernetes API server (nodes, pods, evictions, events) on loopback.

It enforces the semantics a careless client gets wrong:

- every change bumps ``metadata.resourceVersion``; a patch whose result names
  a different resourceVersion than the stored one is 409 Conflict;
- JSON Patch (RFC 6902) is applied all-or-nothing: a failed ``test`` or a bad
  path is 422 and changes nothing;
- merge patches (JSON merge and strategic merge) replace lists whole:
  ``spec.taints`` has no patch merge key, so a patch carrying one taint drops
  every other;
- pods are listed by ``fieldSelector=spec.nodeName=N`` (an unsupported field
  label is 400, as the real server says it), ``limit`` at a time with a
  ``continue`` token (``expire_continue`` makes the next token 410 Gone, as an
  etcd compaction does); a pod is patched (merge or strategic merge:
  annotations merge) and answers 404 once it is gone;
- a pod's ``metadata.uid`` and ``spec.nodeName`` cannot be changed: a patch that
  would is 422 (ValidateObjectMetaUpdate, apimachinery
  ``pkg/api/validation/objectmeta.go``; ValidatePodUpdate, kubernetes
  ``pkg/apis/core/validation/validation.go``);
- an Eviction whose ``deleteOptions.preconditions.uid`` is not the pod's is 409
  Conflict ("Precondition failed: UID in precondition", apiserver
  ``pkg/storage/interfaces.go`` Preconditions.Check);
- a core/v1 Event must name an object of its own namespace (422 otherwise);
- the policy/v1 Eviction API answers 429 (with the ``DisruptionBudget`` cause)
  while a PodDisruptionBudget allows no disruption, 201 with a Status when it
  evicts, 404 for a pod that is gone; an evicted pod is deleted, or only marked
  terminating (``deletionTimestamp``) with ``keep_terminating``;
- the node status subresource (``PATCH .../nodes/NAME/status``) takes a
  strategic merge patch, changes only ``status``, and merges
  ``status.conditions`` by ``type`` (their patchMergeKey; ``$patch: delete``
  removes one), as node-problem-detector's writes rely on;
- a missing or wrong bearer token is 401; ``forbid`` ("patch nodes",
  "create pods/eviction", ...) is RBAC's 403 in the server's words;
- a pod's annotations may hold 256 KiB in all (keys and values): a patch that
  would make them larger is 422 "Too long" (apimachinery
  ``pkg/api/validation/objectmeta.go`` ValidateAnnotations,
  ``TotalAnnotationSizeLimitB = 256 * (1 << 10)``);
- an Eviction of a pod that two PodDisruptionBudgets select is 500
  InternalError "This pod has more than one PodDisruptionBudget, which the
  eviction subresource does not support." (kubernetes
  ``pkg/registry/core/pod/storage/eviction.go``);
- ``deny_namespaces`` (namespace -> words) is a validating admission webhook
  that denies pod patches and evictions there: 403 ``admission webhook "NAME"
  denied the request: WORDS`` (apiserver ``pkg/admission/plugin/webhook/errors``
  ToStatusErr; a webhook that sets no code gets 403);
- a node's labels are validated as the API server does (apimachinery
  ``pkg/apis/meta/v1/validation`` ValidateLabels: IsQualifiedName for the key,
  IsValidLabelValue for the value, ``pkg/util/validation/validation.go``): a
  patch leaving an invalid one is 422 Invalid, with the field's words;
- ``GET /apis/apps/v1/namespaces/NS/daemonsets/NAME`` serves the DaemonSets
  ``add_pod(daemonset=True)`` made (``daemonsets``), as ``kubectl drain`` reads
  them (kubectl ``pkg/drain/filters.go`` daemonSetFilter).

Nodes are listed and watched as a client-go reflector needs (the Kubernetes
API concepts page, "Efficient detection of changes", "Watch bookmarks",
"Retrieving large results sets in chunks"):

- ``GET /api/v1/nodes`` pages with ``limit`` and ``continue``; every page of
  one list is served from the snapshot the first page was cut from, at its
  ``metadata.resourceVersion`` (apiserver ``pkg/storage/etcd3/store.go``
  GetList: the continue token carries the list's revision); a continue
  token past ``expire_continue`` is 410 Expired, as for pods;
- ``fieldSelector=metadata.name=NAME`` selects one node (every resource
  serves ``metadata.name``: apiserver ``pkg/registry/generic`` ObjectMetaFieldsSet,
  kubernetes ``pkg/registry/core/node/strategy.go`` NodeToSelectableFields);
  another field is 400, as for pods;
- ``?watch=1`` streams one JSON event per line (``ADDED``, ``MODIFIED``,
  ``DELETED``, ``BOOKMARK``, ``ERROR``: apimachinery
  ``pkg/apis/meta/v1/watch.go`` WatchEvent) of every change after
  ``resourceVersion``; without one (or ``"0"``) it starts with a synthetic
  ``ADDED`` per node ("Start at Most Recent" / "Any");
- a ``resourceVersion`` older than the last ``compact()`` is an ``ERROR``
  event carrying a 410 Expired Status, ``too old resource version: RV
  (OLDEST)``, on an HTTP 200 stream (apiserver ``pkg/storage/cacher``
  watch_cache.go getAllEventsSinceLocked, and cacher.go newErrWatcher);
- ``allowWatchBookmarks=true`` lets ``bookmark()`` (and, with
  ``bookmark_interval_s``, a timer, as the cacher's bookmarks once a minute do)
  send a ``BOOKMARK`` holding only ``metadata.resourceVersion`` (KEP-956);
- ``timeoutSeconds`` ends the stream cleanly (apiserver
  ``pkg/endpoints/handlers/watch.go``); ``drop_watches()`` cuts every open
  stream mid-way, ``inject_watch_line()`` writes raw bytes into them (a broken
  proxy, a hostile server), ``slow_s`` delays every node list and watch.

Fault controls: ``race_next_patch`` changes the node (adds a taint of its own)
just before the next PATCH is applied, as another controller would;
``before_next_patch`` runs once, with the node's name, at the same point (a
test's own change, e.g. an operator relabelling the node); ``stop()`` then
``start(port)`` is a server that goes away and comes back.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import re
import time
from collections.abc import Callable, Iterable, Iterator
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


def _status(
    code: int, reason: str, message: str, details: dict[str, Any] | None = None
) -> web.Response:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details is not None:
        body["details"] = details
    return web.Response(body=orjson.dumps(body), status=code, content_type="application/json")


def _apply_patch(ctype: str, doc: dict[str, Any], body: Any) -> dict[str, Any] | web.Response:
    """The patched copy of ``doc``, or the error the API server answers."""
    try:
        if ctype == "application/json-patch+json":
            if not isinstance(body, list):
                return _status(400, "BadRequest", "a JSON Patch must be an array")
            patched: dict[str, Any] = json_patch(doc, body)
            return patched
        if ctype in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            merged: dict[str, Any] = merge_patch(doc, body)
            return merged
    except PatchFailed as err:
        return _status(422, "Invalid", str(err))
    return _status(415, "UnsupportedMediaType", f"unsupported patch type {ctype!r}")


ANNOTATIONS_LIMIT = 256 * 1024  # apimachinery TotalAnnotationSizeLimitB
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")


def label_problem(key: str, value: Any) -> str:
    """The API server's words against one label ("" if none): key and value checks."""
    prefix, _, name = key.rpartition("/")
    if "/" in key:
        if not prefix:
            return "prefix part must be non-empty"
        if len(prefix) > 253:
            return "prefix part must be no more than 253 characters"
        if not all(_DNS1123_LABEL.match(part) for part in prefix.split(".")):
            return "prefix part a lowercase RFC 1123 subdomain must consist of lower case" + (
                " alphanumeric characters, '-' or '.'"
            )
    if not name:
        return "name part must be non-empty"
    if len(name) > 63:
        return "name part must be no more than 63 characters"
    if not _QUALIFIED_NAME.match(name):
        return "name part must consist of alphanumeric characters, '-', '_' or '.'"
    if not isinstance(value, str):
        return "a label value must be a string"
    if len(value) > 63:
        return "must be no more than 63 characters"
    if value and not _QUALIFIED_NAME.match(value):
        return "a valid label must be an empty string or consist of alphanumeric characters"
    return ""


ACCOUNT = "system:serviceaccount:rackguard:rackguard"
# Each route as RBAC sees it: (API group, verb, resource), as a ClusterRole grants it.
RBAC = {
    ("GET", "/api/v1/nodes"): ("", "list", "nodes"),  # "watch" with ?watch=1
    ("GET", "/api/v1/nodes/{name}"): ("", "get", "nodes"),
    ("PATCH", "/api/v1/nodes/{name}"): ("", "patch", "nodes"),
    ("PATCH", "/api/v1/nodes/{name}/status"): ("", "patch", "nodes/status"),
    ("GET", "/api/v1/pods"): ("", "list", "pods"),
    ("PATCH", "/api/v1/namespaces/{ns}/pods/{name}"): ("", "patch", "pods"),
    ("POST", "/api/v1/namespaces/{ns}/pods/{name}/eviction"): ("", "create", "pods/eviction"),
    ("POST", "/api/v1/namespaces/{ns}/events"): ("", "create", "events"),
    ("GET", "/apis/apps/v1/namespaces/{ns}/daemonsets/{name}"): ("apps", "get", "daemonsets"),
}


def merge_conditions(current: list[Any], patch: list[Any]) -> list[Any]:
    """A strategic merge of ``status.conditions``: by ``type`` (its patchMergeKey).

    An item with ``$patch: delete`` removes that type; others replace or add it.
    """
    out = [dict(c) for c in current if isinstance(c, dict)]
    for item in patch:
        if not isinstance(item, dict) or not isinstance(item.get("type"), str):
            raise PatchFailed("status.conditions: each item needs a type")
        kept = [c for c in out if c.get("type") != item["type"]]
        if item.get("$patch") == "delete":
            out = kept
            continue
        old = next((c for c in out if c.get("type") == item["type"]), {})
        merged = {**old, **{k: v for k, v in item.items() if v is not None}}
        out = [*kept, merged] if not old else [merged if c is old else c for c in out]
    return out


def _forbidden(
    verb: str, resource: str, name: str, namespace: str = "", group: str = ""
) -> web.Response:
    kind = resource.split("/", maxsplit=1)[0]
    scope = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
    return _status(
        403,
        "Forbidden",
        f'{kind} "{name}" is forbidden: User "{ACCOUNT}" cannot {verb} resource '
        f'"{resource}" in API group "{group}" {scope}',
        {"name": name, "kind": kind},
    )


def _not_found(kind: str, name: str) -> web.Response:
    return _status(404, "NotFound", f'{kind} "{name}" not found', {"name": name, "kind": kind})


@dataclass
class NodeWatcher:
    """One open watch stream on nodes: its selector and its queue of lines to write."""

    name: str  # "" = every node
    bookmarks: bool
    queue: asyncio.Queue[bytes | None] = field(default_factory=asyncio.Queue)  # None: cut it


def _line(kind: str, obj: Any) -> bytes:
    return orjson.dumps({"type": kind, "object": obj}) + b"\n"


def _node_selector(query: Any) -> str | web.Response:
    """The node name of ``fieldSelector=metadata.name=NAME`` ("" for none), or the 400."""
    name = ""
    for term in filter(None, str(query.get("fieldSelector", "")).split(",")):
        label, _, value = term.partition("=")
        if label != "metadata.name" or value.startswith("="):
            return _status(
                400,
                "BadRequest",
                f'"{label}" is not a known field selector: only "metadata.name"',
            )
        name = value
    return name


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
    pod_patches: list[tuple[str, str, Any]] = field(default_factory=list)  # ns/pod, type, body
    status_patches: list[tuple[str, Any]] = field(default_factory=list)  # node, body
    race_next_patch: int = 0  # change the node before the next N patches
    before_next_patch: Callable[[str], None] | None = None  # run once before the next patch
    forbid_patch: bool = False  # RBAC: the account may not patch nodes
    # RBAC: "patch pods", "create pods/eviction", "patch nodes/status"
    forbid: set[str] = field(default_factory=set)
    used: set[tuple[str, str, str]] = field(default_factory=set)  # (group, verb, resource) asked
    keep_terminating: bool = False  # an evicted pod stays, terminating, until removed
    expire_continue: int = 0  # the next N continue tokens answer 410 Gone
    before_next_evict: Callable[[str, str], None] | None = None  # run once, with ns and name
    deny_namespaces: dict[str, str] = field(default_factory=dict)  # admission webhook: ns -> why
    daemonsets: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    node_reads: int = 0  # GET of one node: what steering's reads cost the API server
    node_lists: int = 0  # GET /api/v1/nodes pages (each page one request)
    node_watches: int = 0  # watch requests on nodes
    node_bytes: int = 0  # bytes of node lists and watch events sent
    node_history: list[tuple[int, str, dict[str, Any]]] = field(default_factory=list)
    compacted: int = 0  # watches from before this resourceVersion are 410 Expired
    watchers: list[NodeWatcher] = field(default_factory=list)
    bookmark_interval_s: float = 0.0  # 0: bookmarks only when bookmark() is called
    slow_s: float = 0.0  # every node list and watch answers this much later
    _snapshots: dict[int, tuple[int, list[dict[str, Any]]]] = field(default_factory=dict)
    resource_version: int = 100
    url: str = ""
    _runner: web.AppRunner | None = None
    _names: Iterator[int] = field(default_factory=itertools.count)

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
        self._node_changed("ADDED", name)

    def add_pod(
        self,
        namespace: str,
        name: str,
        node: str,
        *,
        labels: dict[str, str] | None = None,
        daemonset: bool = False,
        mirror: bool = False,
        bare: bool = False,
        phase: str = "Running",
    ) -> None:
        """A pod on ``node``: a ReplicaSet's or a DaemonSet's, bare, or a static pod's mirror."""
        meta: dict[str, Any] = {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{namespace}-{name}",
            "resourceVersion": self._bump(),
            "labels": labels or {},
            "annotations": {},
        }
        if daemonset:
            owner = {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ds"}
            self.daemonsets[(namespace, "ds")] = {
                "kind": "DaemonSet",
                "apiVersion": "apps/v1",
                "metadata": {"name": "ds", "namespace": namespace, "uid": "uid-ds"},
            }
        else:
            owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": f"{name}-rs"}
        meta["ownerReferences"] = [{**owner, "uid": f"uid-{owner['name']}", "controller": True}]
        if bare:  # created on its own: no controller starts it again
            del meta["ownerReferences"]
        if mirror:  # a static pod's mirror: owned by the Node, marked by the kubelet
            meta["annotations"]["kubernetes.io/config.mirror"] = "0f1e2d3c"
            meta["ownerReferences"] = [
                {"apiVersion": "v1", "kind": "Node", "name": node, "controller": True}
            ]
        self.pods[(namespace, name)] = {
            "kind": "Pod",
            "apiVersion": "v1",
            "metadata": meta,
            "spec": {"nodeName": node},
            "status": {"phase": phase},
        }

    def pod_events(self, namespace: str, name: str) -> list[dict[str, Any]]:
        """The Events recorded on one pod."""
        return [
            e
            for e in self.events
            if e["involvedObject"].get("kind") == "Pod"
            and (e["involvedObject"].get("namespace"), e["involvedObject"].get("name"))
            == (namespace, name)
        ]

    def replace_pod(self, namespace: str, name: str, node: str) -> None:
        """The pod's controller recreates it under the same name, on ``node``, with a new uid."""
        self.pods.pop((namespace, name), None)
        self.add_pod(namespace, name, node)
        self.pods[(namespace, name)]["metadata"]["uid"] = f"uid-{namespace}-{name}-{self._bump()}"

    def remove_terminating(self) -> None:
        """The kubelet finishes stopping the pods being deleted."""
        for key in [k for k, p in self.pods.items() if p["metadata"].get("deletionTimestamp")]:
            del self.pods[key]

    def edit_node(self, name: str, patch: dict[str, Any]) -> None:
        """Someone else changes the node (a merge patch, lists replaced whole)."""
        node = merge_patch(self.nodes[name], patch)
        node["metadata"]["resourceVersion"] = self._bump()
        self.nodes[name] = node
        self._node_changed("MODIFIED", name)

    def remove_node(self, name: str) -> None:
        """The node object is deleted (the node left the cluster)."""
        node = self.nodes.pop(name)
        node["metadata"]["resourceVersion"] = self._bump()
        self._node_changed("DELETED", name, node)

    def _node_changed(self, kind: str, name: str, obj: dict[str, Any] | None = None) -> None:
        """Keep the event for later watches and send it to the open ones that select it."""
        node = copy.deepcopy(obj if obj is not None else self.nodes[name])
        self.node_history.append((int(node["metadata"]["resourceVersion"]), kind, node))
        line = _line(kind, node)
        for w in self.watchers:
            if w.name in ("", name):
                w.queue.put_nowait(line)

    def compact(self) -> None:
        """etcd compacted the history: every resourceVersion before now is too old to watch."""
        self.compacted = self.resource_version
        self.node_history.clear()

    def bookmark(self) -> None:
        """A BOOKMARK at the current resourceVersion to every watch that allowed bookmarks."""
        for w in self.watchers:
            if w.bookmarks:
                w.queue.put_nowait(self._bookmark_line())

    def _bookmark_line(self) -> bytes:
        meta = {"resourceVersion": str(self.resource_version)}
        return _line("BOOKMARK", {"kind": "Node", "apiVersion": "v1", "metadata": meta})

    def drop_watches(self) -> None:
        """Cut every open watch stream without its end (a proxy restart, a lost connection)."""
        for w in self.watchers:
            w.queue.put_nowait(None)

    def inject_watch_line(self, raw: bytes) -> None:
        """Write ``raw`` (and a newline) into every open watch stream."""
        for w in self.watchers:
            w.queue.put_nowait(raw.rstrip(b"\n") + b"\n")

    # ------------------------------------------------------------------ server

    async def start(self, port: int = 0) -> str:
        """Serve on loopback (a free port, or ``port`` to come back where it was); the base URL."""
        app = web.Application(middlewares=[self._auth])
        app.router.add_get("/api/v1/nodes", self._list_nodes)
        app.router.add_get("/api/v1/nodes/{name}", self._get_node)
        app.router.add_patch("/api/v1/nodes/{name}", self._patch_node)
        app.router.add_patch("/api/v1/nodes/{name}/status", self._patch_node_status)
        app.router.add_get("/api/v1/pods", self._list_pods)
        app.router.add_patch("/api/v1/namespaces/{ns}/pods/{name}", self._patch_pod)
        app.router.add_post("/api/v1/namespaces/{ns}/pods/{name}/eviction", self._evict)
        app.router.add_post("/api/v1/namespaces/{ns}/events", self._event)
        app.router.add_get("/apis/apps/v1/namespaces/{ns}/daemonsets/{name}", self._get_daemonset)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port, reuse_address=True)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self.url

    async def stop(self) -> None:
        """Stop serving (open watch streams are cut first)."""
        self.drop_watches()
        while self.watchers:  # noqa: ASYNC110 (each handler removes itself as it ends)
            await asyncio.sleep(0.01)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return _status(401, "Unauthorized", "Unauthorized")
        route = request.match_info.route.resource
        if route is not None:
            group, verb, resource = RBAC[(request.method, route.canonical)]
            if verb == "list" and request.query.get("watch") in ("1", "true"):
                verb = "watch"
            self.used.add((group, verb, resource))
        resp: web.StreamResponse = await handler(request)
        return resp

    @staticmethod
    def _json(body: Any, status: int = 200) -> web.Response:
        return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")

    def _expire_continue(self) -> web.Response | None:
        """410 Expired for a continue token, while ``expire_continue`` says so."""
        if self.expire_continue <= 0:
            return None
        self.expire_continue -= 1
        return _status(
            410,
            "Expired",
            "The provided continue parameter is too old to display a consistent list"
            " result. You can start a new list without the continue parameter.",
        )

    async def _list_nodes(self, request: web.Request) -> web.StreamResponse:
        if self.slow_s:
            await asyncio.sleep(self.slow_s)
        name = _node_selector(request.query)
        if isinstance(name, web.Response):
            return name
        if request.query.get("watch") in ("1", "true"):
            return await self._watch_nodes(request, name)
        self.node_lists += 1
        token = request.query.get("continue", "")
        if token:
            if (expired := self._expire_continue()) is not None:
                return expired
            snap, _, offset = token.partition("-")
            rv, items = self._snapshots[int(snap)]
            start = int(offset)
        else:
            rv = self.resource_version
            items = [copy.deepcopy(n) for k, n in sorted(self.nodes.items()) if name in ("", k)]
            start = 0
        limit = int(request.query.get("limit", "0") or 0)
        end = start + limit if limit > 0 else len(items)
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if end < len(items):
            snap_id = int(token.partition("-")[0]) if token else next(self._names)
            self._snapshots[snap_id] = (rv, items)
            meta["continue"] = f"{snap_id}-{end}"
            meta["remainingItemCount"] = len(items) - end
        body = orjson.dumps(
            {"kind": "NodeList", "apiVersion": "v1", "metadata": meta, "items": items[start:end]}
        )
        self.node_bytes += len(body)
        return web.Response(body=body, content_type="application/json")

    async def _watch_nodes(self, request: web.Request, name: str) -> web.StreamResponse:
        self.node_watches += 1
        q = request.query
        since = q.get("resourceVersion", "")
        timeout = float(q.get("timeoutSeconds", "0") or 0) or 1800.0  # minRequestTimeout
        if not since.isdigit() and since:
            return _status(400, "BadRequest", f'invalid resource version: "{since}"')
        watcher = NodeWatcher(name, q.get("allowWatchBookmarks") in ("1", "true"))
        if since not in ("", "0") and int(since) < self.compacted:
            oldest = self.node_history[0][0] - 1 if self.node_history else self.compacted
            expired = {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": f"too old resource version: {since} ({oldest})",
                "reason": "Expired",
                "code": 410,
            }
            watcher.queue.put_nowait(_line("ERROR", expired))
            watcher.queue.put_nowait(b"")  # the end of the stream
        elif since in ("", "0"):
            for key, node in sorted(self.nodes.items()):
                if name in ("", key):
                    watcher.queue.put_nowait(_line("ADDED", node))
        else:
            for rv, kind, node in self.node_history:
                if rv > int(since) and name in ("", node["metadata"]["name"]):
                    watcher.queue.put_nowait(_line(kind, node))
        self.watchers.append(watcher)
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        next_mark = loop.time() + (self.bookmark_interval_s or timeout)
        try:
            while loop.time() < deadline:
                if request.transport is None or request.transport.is_closing():
                    return resp  # the client went away
                try:
                    line = await asyncio.wait_for(watcher.queue.get(), 0.1)
                except TimeoutError:
                    if not (self.bookmark_interval_s and watcher.bookmarks):
                        continue
                    if loop.time() < next_mark:
                        continue
                    next_mark = loop.time() + self.bookmark_interval_s
                    line = self._bookmark_line()
                if line is None:  # cut: no chunked terminator, the client sees it broken
                    if request.transport is not None:
                        request.transport.abort()
                    return resp
                if not line:
                    break
                self.node_bytes += len(line)
                await resp.write(line)
        finally:
            self.watchers.remove(watcher)
        await resp.write_eof()
        return resp

    async def _get_node(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        self.node_reads += 1
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
        if self.before_next_patch is not None:
            hook, self.before_next_patch = self.before_next_patch, None
            hook(name)
        if self.race_next_patch > 0:
            self.race_next_patch -= 1
            taints = [*self.nodes[name]["spec"].get("taints", [])]
            taints.append(
                {"key": f"other.io/racer-{self.resource_version}", "effect": "NoSchedule"}
            )
            self.edit_node(name, {"spec": {"taints": taints}})
        current = self.nodes[name]
        patched = _apply_patch(ctype, current, body)
        if isinstance(patched, web.Response):
            return patched
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
        for key, value in (patched["metadata"].get("labels") or {}).items():
            problem = label_problem(str(key), value)
            if problem:
                return _status(
                    422,
                    "Invalid",
                    f'Node "{name}" is invalid: metadata.labels: Invalid value: "{key}": {problem}',
                )
        patched["metadata"]["resourceVersion"] = self._bump()
        self.nodes[name] = patched
        self._node_changed("MODIFIED", name)
        return self._json(patched)

    async def _patch_node_status(self, request: web.Request) -> web.Response:
        """The status subresource: only ``status`` changes; conditions merge by type."""
        name = request.match_info["name"]
        if name not in self.nodes:
            return _status(404, "NotFound", f'nodes "{name}" not found')
        if "patch nodes/status" in self.forbid:
            return _forbidden("patch", "nodes/status", name)
        ctype = request.headers.get("Content-Type", "").split(";")[0].strip()
        if ctype != "application/strategic-merge-patch+json":
            return _status(415, "UnsupportedMediaType", f"unsupported patch type {ctype!r}")
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return _status(400, "BadRequest", "invalid JSON in patch")
        if not isinstance(body, dict) or not isinstance(body.get("status", {}), dict):
            return _status(400, "BadRequest", "a node status patch must be an object")
        self.status_patches.append((name, body))
        node = self.nodes[name]
        status = dict(node.get("status") or {})
        for key, value in body.get("status", {}).items():
            if key == "conditions":
                try:
                    status[key] = merge_conditions(status.get(key) or [], value or [])
                except PatchFailed as err:
                    return _status(422, "Invalid", str(err))
            else:
                status[key] = merge_patch(status.get(key), value)
        node["status"] = status
        node["metadata"]["resourceVersion"] = self._bump()
        self._node_changed("MODIFIED", name)
        return self._json(node)

    async def _list_pods(self, request: web.Request) -> web.Response:
        items = list(self.pods.values())
        selector = request.query.get("fieldSelector", "")
        for term in filter(None, selector.split(",")):
            label, op, value = term.partition("!=") if "!=" in term else term.partition("=")
            value = value.removeprefix("=")  # "==" is "="
            if label != "spec.nodeName":
                return _status(
                    400,
                    "BadRequest",
                    f'"{label}" is not a known field selector: only "spec.nodeName"',
                )
            keep = op == "="
            items = [p for p in items if (p["spec"]["nodeName"] == value) == keep]
        start = 0
        token = request.query.get("continue", "")
        if token:
            if (expired := self._expire_continue()) is not None:
                return expired
            start = int(token.removeprefix("offset-"))
        limit = int(request.query.get("limit", "0") or 0)
        end = start + limit if limit > 0 else len(items)
        meta: dict[str, Any] = {"resourceVersion": str(self.resource_version)}
        if end < len(items):
            meta["continue"] = f"offset-{end}"
            meta["remainingItemCount"] = len(items) - end
        page = items[start:end]
        return self._json({"kind": "PodList", "apiVersion": "v1", "metadata": meta, "items": page})

    async def _patch_pod(self, request: web.Request) -> web.Response:
        ns, name = request.match_info["ns"], request.match_info["name"]
        if "patch pods" in self.forbid:
            return _forbidden("patch", "pods", name, ns)
        if ns in self.deny_namespaces:
            return self._denied(ns)
        pod = self.pods.get((ns, name))
        if pod is None:
            return _not_found("pods", name)
        ctype = request.headers.get("Content-Type", "").split(";")[0].strip()
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return _status(400, "BadRequest", "invalid JSON in patch")
        self.pod_patches.append((f"{ns}/{name}", ctype, body))
        patched = _apply_patch(ctype, pod, body)
        if isinstance(patched, web.Response):
            return patched
        if (patched["metadata"].get("name"), patched["metadata"].get("namespace")) != (name, ns):
            return _status(422, "Invalid", "metadata.name and metadata.namespace are immutable")
        if patched["metadata"].get("uid") != pod["metadata"]["uid"]:
            return _status(
                422,
                "Invalid",
                f'Pod "{name}" is invalid: metadata.uid: Invalid value: '
                f'"{patched["metadata"].get("uid")}": field is immutable',
            )
        if (patched.get("spec") or {}).get("nodeName") != pod["spec"]["nodeName"]:
            return _status(
                422,
                "Invalid",
                f'Pod "{name}" is invalid: spec: Forbidden: pod updates may not change fields'
                " other than `spec.containers[*].image`, `spec.initContainers[*].image`,"
                " `spec.activeDeadlineSeconds`, `spec.tolerations` (only additions to existing"
                " tolerations), `spec.terminationGracePeriodSeconds`",
            )
        annotations = patched["metadata"].get("annotations") or {}
        if sum(len(k) + len(str(v)) for k, v in annotations.items()) > ANNOTATIONS_LIMIT:
            return _status(
                422,
                "Invalid",
                f'Pod "{name}" is invalid: metadata.annotations: Too long: must have at most'
                f" {ANNOTATIONS_LIMIT} bytes",
            )
        if patched == pod:  # a patch that changes nothing (a "test") changes no version
            return self._json(pod)
        patched["metadata"]["resourceVersion"] = self._bump()
        self.pods[(ns, name)] = patched
        return self._json(patched)

    async def _evict(self, request: web.Request) -> web.Response:
        ns, name = request.match_info["ns"], request.match_info["name"]
        if "create pods/eviction" in self.forbid:
            self.evictions.append((ns, name, 403))
            return _forbidden("create", "pods/eviction", name, ns)
        if ns in self.deny_namespaces:
            self.evictions.append((ns, name, 403))
            return self._denied(ns)
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return _status(400, "BadRequest", "invalid JSON in eviction")
        if (
            not isinstance(body, dict)
            or body.get("kind") != "Eviction"
            or body.get("apiVersion") != "policy/v1"
        ):
            return _status(400, "BadRequest", "expected a policy/v1 Eviction")
        if (body.get("metadata") or {}).get("name") != name:
            return _status(400, "BadRequest", "name in URL does not match name in Eviction object")
        if self.before_next_evict is not None:
            hook, self.before_next_evict = self.before_next_evict, None
            hook(ns, name)
        pod = self.pods.get((ns, name))
        if pod is None:
            self.evictions.append((ns, name, 404))
            return _not_found("pods", name)
        options = body.get("deleteOptions") or {}
        wanted = (options.get("preconditions") or {}).get("uid")
        if wanted is not None and wanted != pod["metadata"]["uid"]:
            self.evictions.append((ns, name, 409))
            return _status(
                409,
                "Conflict",
                f"Operation cannot be fulfilled on Pod {name!r}: Precondition failed: UID in"
                f" precondition: {wanted}, UID in object meta: {pod['metadata']['uid']}",
            )
        labels = pod["metadata"].get("labels", {})
        covering = [b for b in self.budgets if labels.get(b.label[0]) == b.label[1]]
        if len(covering) > 1:
            self.evictions.append((ns, name, 500))
            return _status(
                500,
                "InternalError",
                "Internal error occurred: This pod has more than one PodDisruptionBudget,"
                " which the eviction subresource does not support.",
            )
        for budget in covering:
            if budget.disruptions_allowed <= 0:
                self.evictions.append((ns, name, 429))
                cause = {
                    "reason": "DisruptionBudget",
                    "message": f"The disruption budget {budget.label[1]}-pdb needs 1 healthy pods "
                    "and has 1 currently",
                }
                return _status(
                    429,
                    "TooManyRequests",
                    "Cannot evict pod as it would violate the pod's disruption budget.",
                    {"causes": [cause]},
                )
            budget.disruptions_allowed -= 1
        if self.keep_terminating:
            pod["metadata"]["deletionTimestamp"] = time.strftime(
                "%Y-%m-%dT%H:%M:%SZ", time.gmtime()
            )
        else:
            del self.pods[(ns, name)]
        self.evictions.append((ns, name, 201))
        done = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}
        return self._json({**done, "code": 201}, 201)

    def _denied(self, ns: str) -> web.Response:
        return _status(
            403,
            "Forbidden",
            f'admission webhook "policy.{ns}.example.com" denied the request:'
            f" {self.deny_namespaces[ns]}",
        )

    async def _get_daemonset(self, request: web.Request) -> web.Response:
        ns, name = request.match_info["ns"], request.match_info["name"]
        if "get daemonsets" in self.forbid:
            return _forbidden("get", "daemonsets", name, ns, group="apps")
        ds = self.daemonsets.get((ns, name))
        if ds is None:
            return _status(
                404,
                "NotFound",
                f'daemonsets.apps "{name}" not found',
                {"name": name, "group": "apps", "kind": "daemonsets"},
            )
        return self._json(ds)

    async def _event(self, request: web.Request) -> web.Response:
        ns = request.match_info["ns"]
        if "create events" in self.forbid:
            return _forbidden("create", "events", "", ns)
        event = orjson.loads(await request.read())
        meta = event.setdefault("metadata", {})
        involved = event.get("involvedObject") or {}
        if involved.get("kind") != "Node" and involved.get("namespace") != ns:
            return _status(
                422,
                "Invalid",
                f'Event "{meta.get("name", "")}" is invalid: involvedObject.namespace: Invalid '
                f'value: "{involved.get("namespace", "")}": does not match event.namespace',
            )
        meta["name"] = (
            meta.get("name") or f"{meta.get('generateName', 'event-')}{next(self._names)}"
        )
        meta["namespace"] = ns
        self.events.append(event)
        return self._json(event, 201)
