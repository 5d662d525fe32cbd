"""Kubernetes sink: cordon and taint a node (drain / exclude), undo only what rackguard did.

- drain: ``spec.unschedulable = true`` and the taint ``<taint_key>=drain:NoSchedule``;
  the pods keep running. Their notice (an annotation and an Event per pod) and
  their eviction after the grace are the job notice's (pods.py).
- exclude: the taint ``<taint_key>=exclude:NoSchedule`` (``exclude_state =
  "drain"``, the default: the pods are told and evicted after the critical grace)
  or ``NoExecute`` (``"down"``: the taint manager evicts at once, no grace).
- resume: our taint removed; the cordon lifted only if rackguard set it
  (annotation ``rackguard.io/cordoned``).

``spec.taints`` has no merge key: any patch replaces the whole list. So every
change is one JSON Patch (RFC 6902) built from the node as just read, guarded
by a ``test`` of its ``resourceVersion``; a concurrent change fails the test
(422) or conflicts (409), and the change is rebuilt from a fresh read. Other
taints are never dropped. The reason is recorded as the annotation
``rackguard.io/reason`` and, optionally, as an Event on the node.
"""

from __future__ import annotations

import logging
import os
import ssl
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import orjson

from adapters.base import DeliveryError, http_error
from adapters.schedulers.base import EXCLUDE_STATE_DEFAULT, ExcludeState, NodeReadError, NodeView
from adapters.schedulers.bounded import read_error_body
from adapters.schedulers.kubernetes.listing import listed_kube
from adapters.schedulers.listing import ListedNode
from policies.model import Action, Decision
from policies.safety import scheduler_reason

log = logging.getLogger(__name__)

ANNOTATION_PREFIX = "rackguard.io/"
REASON_ANNOTATION = "rackguard.io/reason"
KEY_ANNOTATION = "rackguard.io/key"
CORDONED_ANNOTATION = "rackguard.io/cordoned"
EFFECT = {Action.DRAIN: "NoSchedule", Action.EXCLUDE: "NoExecute"}
FOREIGN_CORDON = "cordoned outside rackguard"
SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
JSON_PATCH = "application/json-patch+json"


class KubeAuthError(Exception):
    """No usable API server address or credentials."""


@dataclass(frozen=True, slots=True)
class KubeConnection:
    """Where the API server is and how to authenticate to it."""

    api_url: str
    token: Callable[[], str]  # called per request: mounted tokens rotate
    ssl: ssl.SSLContext | bool


def _file_token(path: Path) -> Callable[[], str]:
    def read() -> str:
        try:
            return path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as err:
            raise KubeAuthError(f"cannot read token file {str(path)!r}: {err}") from err

    return read


def _ssl(
    ca_file: Path | None, insecure: bool, ca_data: bytes | None = None
) -> ssl.SSLContext | bool:
    if insecure:
        return False
    if ca_file is None and ca_data is None:
        return True
    try:
        ctx = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
        if ca_data is not None:
            ctx.load_verify_locations(cadata=ca_data.decode())
    except (OSError, ssl.SSLError) as err:
        raise KubeAuthError(
            f"cannot load the cluster CA {str(ca_file or 'data')!r}: {err}"
        ) from err
    return ctx


def connection(
    *,
    api_url: str = "",
    token_file: Path | None = None,
    ca_file: Path | None = None,
    kubeconfig: Path | None = None,
    insecure_skip_tls_verify: bool = False,
    environ: Mapping[str, str] | None = None,
) -> KubeConnection:
    """Resolve the connection: explicit settings, a kubeconfig, or the in-cluster account."""
    env = os.environ if environ is None else environ
    if kubeconfig is not None:
        return _from_kubeconfig(kubeconfig, insecure_skip_tls_verify)
    if not api_url:
        host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
        if not host or not port:
            raise KubeAuthError(
                "no api_url, no kubeconfig and not in a cluster (KUBERNETES_SERVICE_HOST unset)"
            )
        host = f"[{host}]" if ":" in host else host
        api_url = f"https://{host}:{port}"
        token_file = token_file or SA_DIR / "token"
        ca_file = ca_file or SA_DIR / "ca.crt"
    if token_file is None:
        raise KubeAuthError("token_file is required with api_url")
    return KubeConnection(
        api_url.rstrip("/"), _file_token(token_file), _ssl(ca_file, insecure_skip_tls_verify)
    )


def _from_kubeconfig(path: Path, insecure: bool) -> KubeConnection:
    import base64  # noqa: PLC0415 - only kubeconfig users need these

    import yaml  # noqa: PLC0415

    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as err:
        raise KubeAuthError(f"kubeconfig {str(path)!r}: {err}") from err
    try:
        ctx_name = doc["current-context"]
        ctx = next(c["context"] for c in doc["contexts"] if c["name"] == ctx_name)
        cluster = next(c["cluster"] for c in doc["clusters"] if c["name"] == ctx["cluster"])
        user = next(u["user"] for u in doc["users"] if u["name"] == ctx["user"])
    except (KeyError, TypeError, StopIteration) as err:
        raise KubeAuthError(f"kubeconfig {str(path)!r}: no usable current context") from err
    if "token" in user:
        token = str(user["token"])

        def tok() -> str:
            return token

        token_fn: Callable[[], str] = tok
    elif "tokenFile" in user:
        token_fn = _file_token(Path(user["tokenFile"]))
    else:
        raise KubeAuthError(
            f"kubeconfig {str(path)!r}: user {ctx['user']!r} has no token "
            "(client certificates and exec plugins are not supported)"
        )
    ca_data = cluster.get("certificate-authority-data")
    ca_file = cluster.get("certificate-authority")
    return KubeConnection(
        str(cluster["server"]).rstrip("/"),
        token_fn,
        _ssl(
            Path(ca_file) if ca_file else None,
            insecure or bool(cluster.get("insecure-skip-tls-verify")),
            base64.b64decode(ca_data) if ca_data else None,
        ),
    )


def _ptr(*parts: str) -> str:
    """A JSON Pointer (RFC 6901) from raw path segments."""
    return "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in parts)


def api_message(body: Any) -> str:
    """The ``message`` of a Kubernetes Status body (or the body itself)."""
    return str(body.get("message", "")) if isinstance(body, dict) else str(body)


class KubeClient:
    """One API server session: JSON requests with the bearer token, a timeout per request."""

    def __init__(self, conn: KubeConnection, *, timeout_s: float = 10.0) -> None:
        self._conn = conn
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
    ) -> tuple[int, Any]:
        """(HTTP status, the parsed body); raises DeliveryError when the server is not reached."""
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        try:
            headers = {
                "Authorization": f"Bearer {self._conn.token()}",
                "Accept": "application/json",
            }
        except KubeAuthError as err:
            raise DeliveryError(f"kubernetes: {err}") from err
        data = None
        if body is not None:
            data = orjson.dumps(body)
            headers["Content-Type"] = content_type
        url = self._conn.api_url + path
        try:
            async with self._session.request(
                method, url, data=data, headers=headers, ssl=self._conn.ssl
            ) as resp:
                status = resp.status
                raw = await resp.read() if status < 300 else await read_error_body(resp)
        except (aiohttp.ClientError, TimeoutError) as err:
            raise DeliveryError(f"kubernetes {method} {url}: {type(err).__name__}: {err}") from err
        try:
            return status, orjson.loads(raw) if raw else {}
        except orjson.JSONDecodeError:
            return status, {"message": raw.decode(errors="replace")[:200]}

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None


class KubernetesSink:
    """Delivers decisions to a Kubernetes API server and reads nodes back."""

    def __init__(
        self,
        conn: KubeConnection,
        *,
        taint_key: str = "rackguard.io/thermal",
        exclude_state: ExcludeState = EXCLUDE_STATE_DEFAULT,
        record_events: bool = True,
        timeout_s: float = 10.0,
        conflict_retries: int = 5,
        event_namespace: str = "default",
    ) -> None:
        self.name = "kubernetes"
        self.client = KubeClient(conn, timeout_s=timeout_s)
        self._call = self.client.call
        self._taint_key = taint_key
        # "drain": an exclusion is NoSchedule too, its pods evicted after the grace.
        self.exclude_down = exclude_state == "down"
        self._events = record_events
        self._retries = conflict_retries
        self._event_ns = event_namespace
        self.conflicts = 0  # resourceVersion races lost and retried

    # ------------------------------------------------------------------ HTTP

    @staticmethod
    def _fail(what: str, status: int, body: Any) -> DeliveryError:
        message = api_message(body)
        if status == 403:
            return DeliveryError(
                f"{what}: HTTP 403 Forbidden: {message} (the account needs get, list and"
                " patch on nodes and create on events; see the shipped ClusterRole)",
                permanent=True,
                reason="auth",
            )
        return http_error(f"{what}: HTTP {status}: {message}", status)

    async def _get_node(self, name: str) -> dict[str, Any]:
        status, body = await self._call("GET", f"/api/v1/nodes/{quote(name, safe='')}")
        if status == 200 and isinstance(body, dict):
            return body
        if status == 404:
            raise DeliveryError(
                f"{name}: no such Kubernetes node", permanent=True, reason="not_found"
            )
        raise self._fail(f"GET node {name}", status, body)

    # ------------------------------------------------------------------ reads

    def _view(self, node: Mapping[str, Any]) -> NodeView:
        meta = node.get("metadata", {})
        spec = node.get("spec", {})
        ann = meta.get("annotations") or {}
        ours = {
            t.get("effect") for t in spec.get("taints") or [] if t.get("key") == self._taint_key
        }
        cordoned = bool(spec.get("unschedulable"))
        our_cordon = ann.get(CORDONED_ANNOTATION) == "true"
        if ours:
            reason = ann.get(REASON_ANNOTATION, "")
        elif cordoned and not our_cordon:
            reason = FOREIGN_CORDON
        else:
            reason = ann.get(REASON_ANNOTATION, "") if cordoned else ""
        words = sorted(str(e) for e in ours) + (["Unschedulable"] if cordoned else [])
        return NodeView(
            node=str(meta.get("name", "")),
            drained="NoSchedule" in ours or (cordoned and not ours),
            down="NoExecute" in ours,
            reason=reason,
            detail="+".join(words) or "Schedulable",
        )

    async def list_nodes(self) -> list[ListedNode]:
        """Every node in one read of the node list, with its rack label."""
        try:
            status, body = await self._call("GET", "/api/v1/nodes")
            if status != 200 or not isinstance(body, dict):
                raise self._fail("list nodes", status, body)
        except DeliveryError as err:
            raise NodeReadError(str(err), permanent=err.permanent) from err
        items = [n for n in body.get("items") or [] if isinstance(n, dict)]
        return [listed_kube(n, self._view(n)) for n in items]

    async def read_state(self, nodes: Sequence[str]) -> dict[str, NodeView]:
        """Each node's cordon, our taint and reason; a missing node has exists=False."""
        out: dict[str, NodeView] = {}
        try:
            for name in nodes:
                try:
                    node = await self._get_node(name)
                except DeliveryError as err:
                    if err.permanent and "no such" in str(err):
                        out[name] = NodeView(name, exists=False)
                        continue
                    raise
                out[name] = self._view(node)
        except DeliveryError as err:
            raise NodeReadError(str(err), permanent=err.permanent) from err
        return out

    # ------------------------------------------------------------------ writes

    def _effect(self, action: Action) -> str:
        return EFFECT[action] if self.exclude_down else "NoSchedule"

    def _patch_for(self, node: Mapping[str, Any], decision: Decision) -> list[dict[str, Any]]:
        meta = node.get("metadata", {})
        spec = node.get("spec", {})
        taints = list(spec.get("taints") or [])
        others = [t for t in taints if t.get("key") != self._taint_key]
        ann = dict(meta.get("annotations") or {})
        cordoned = bool(spec.get("unschedulable"))
        ops: list[dict[str, Any]] = [
            {"op": "test", "path": "/metadata/resourceVersion", "value": meta["resourceVersion"]}
        ]
        if decision.action is Action.RESUME:
            new_taints = others
            if ann.get(CORDONED_ANNOTATION) == "true":
                ops.append({"op": "add", "path": "/spec/unschedulable", "value": False})
            for k in [k for k in ann if k.startswith(ANNOTATION_PREFIX)]:
                del ann[k]
        else:
            new_taints = [
                *others,
                {
                    "key": self._taint_key,
                    "value": decision.action.value,
                    "effect": self._effect(decision.action),
                },
            ]
            if not cordoned:
                ops.append({"op": "add", "path": "/spec/unschedulable", "value": True})
                ann[CORDONED_ANNOTATION] = "true"
            ann[REASON_ANNOTATION] = scheduler_reason(decision)
            ann[KEY_ANNOTATION] = decision.key
        # The whole list, as read plus or minus ours: the test above guards it.
        if new_taints != taints and (new_taints or "taints" in spec):
            ops.append({"op": "add", "path": "/spec/taints", "value": new_taints})
        if ann != (meta.get("annotations") or {}):
            ops.append({"op": "add", "path": "/metadata/annotations", "value": ann})
        return ops

    async def deliver(self, decision: Decision) -> None:
        """Apply the decision with a resourceVersion-guarded JSON Patch; record an Event."""
        name = decision.node
        path = f"/api/v1/nodes/{quote(name, safe='')}"
        patched = False
        for _ in range(self._retries):
            node = await self._get_node(name)
            ops = self._patch_for(node, decision)
            if len(ops) == 1:
                break  # nothing to change
            status, body = await self._call("PATCH", path, ops, content_type=JSON_PATCH)
            if status == 200:
                patched = True
                break
            if status in (409, 422):
                # 409: stale resourceVersion; 422: our "test" failed. Someone
                # changed the node since we read it: rebuild from a fresh read.
                self.conflicts += 1
                log.debug("%s: node changed under us (HTTP %d); re-reading", name, status)
                continue
            raise self._fail(f"PATCH node {name}", status, body)
        else:
            raise DeliveryError(
                f"{name}: node kept changing under us ({self._retries} conflicts); will retry"
            )
        # One Event per change, not per retry (a PDB blocking eviction retries
        # for hours); and the Event is a courtesy: failing to post it fails nothing.
        if self._events and patched:
            try:
                await self._record_event(node, decision)
            except DeliveryError as err:
                log.warning("%s: could not record the Event: %s", name, err)

    async def _record_event(self, node: Mapping[str, Any], decision: Decision) -> None:
        meta = node.get("metadata", {})
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": "rackguard-", "namespace": self._event_ns},
            "involvedObject": {
                "kind": "Node",
                "name": meta.get("name"),
                "uid": meta.get("uid", ""),
            },
            "reason": f"Rackguard{decision.action.value.capitalize()}",
            "message": decision.reason,
            "type": "Normal" if decision.action is Action.RESUME else "Warning",
            "source": {"component": "rackguard"},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        status, body = await self._call(
            "POST", f"/api/v1/namespaces/{self._event_ns}/events", event
        )
        if status not in (200, 201):
            # The annotation already carries the reason; an Event is a courtesy.
            log.debug("%s: event not recorded: HTTP %d %s", decision.node, status, body)

    async def close(self) -> None:
        """Close the HTTP session."""
        await self.client.close()
