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

The *why* is also a Node Condition, ``RackguardThermal`` (the convention
node-problem-detector, draino and medik8s share: a taint says whether a node
is bad, a condition says why): ``True`` with reason ``ThermalDrain`` or
``ThermalExclude`` and the decision's reason as message, ``False`` /
``ThermalOK`` after a resume. It is written through the status subresource
(``PATCH nodes/NAME/status``, a strategic merge on ``conditions`` by type, so
the kubelet's own conditions are untouched); its ``lastTransitionTime`` moves
only when its status does. Failing to write it fails nothing: a WARNING and a
Warning Event on the node say so.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

from adapters.base import DeliveryError
from adapters.schedulers.base import EXCLUDE_STATE_DEFAULT, ExcludeState, NodeReadError, NodeView
from adapters.schedulers.kubernetes.client import JSON_PATCH, KubeClient, node_error
from adapters.schedulers.kubernetes.watch import NodeWatch
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
CONDITION_TYPE = "RackguardThermal"
CONDITION_REASON = {
    Action.DRAIN: "ThermalDrain",
    Action.EXCLUDE: "ThermalExclude",
    Action.RESUME: "ThermalOK",
}
STRATEGIC_MERGE = "application/strategic-merge-patch+json"


def _kube_time() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def condition_for(node: Mapping[str, Any], decision: Decision, now: str) -> dict[str, str]:
    """The ``RackguardThermal`` condition a decision sets, its transition time kept if unchanged."""
    status = "False" if decision.action is Action.RESUME else "True"
    conditions = (node.get("status") or {}).get("conditions") or []
    old = next(
        (c for c in conditions if isinstance(c, dict) and c.get("type") == CONDITION_TYPE), {}
    )
    since = old.get("lastTransitionTime") if old.get("status") == status else None
    return {
        "type": CONDITION_TYPE,
        "status": status,
        "reason": CONDITION_REASON[decision.action],
        "message": scheduler_reason(decision),
        "lastHeartbeatTime": now,
        "lastTransitionTime": str(since or now),
    }


class KubernetesSink:
    """Delivers decisions to a Kubernetes API server and reads nodes back."""

    def __init__(
        self,
        client: KubeClient,
        *,
        taint_key: str = "rackguard.io/thermal",
        exclude_state: ExcludeState = EXCLUDE_STATE_DEFAULT,
        record_events: bool = True,
        conflict_retries: int = 5,
        event_namespace: str = "default",
    ) -> None:
        self.name = "kubernetes"
        self.client = client
        self._call = client.call
        self._taint_key = taint_key
        # "drain": an exclusion is NoSchedule too, its pods evicted after the grace.
        self.exclude_down = exclude_state == "down"
        self._events = record_events
        self._retries = conflict_retries
        self._event_ns = event_namespace
        self.conflicts = 0  # resourceVersion races lost and retried
        self.watch = NodeWatch(client, self._view)

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

    def follow(self, on: bool) -> None:
        """Keep the node list by one watch (the cluster's reader) or read it when asked."""
        self.watch.follow(on)

    def watch_counts(self) -> Mapping[str, int]:
        """The watch's requests and events so far, by kind."""
        w = self.watch
        return {
            "lists": w.lists,
            "pages": w.pages,
            "watches": w.watches,
            "relists": w.relists,
            "bookmarks": w.bookmarks,
            "events": w.events,
            "malformed": w.malformed,
        }

    async def list_nodes(self) -> list[ListedNode]:
        """Every node with its rack label: the watch's list, or one paged LIST."""
        if self.watch.following:
            return await self.watch.current()
        nodes, _ = await self.watch.list_all()
        return list(nodes.values())

    async def read_state(self, nodes: Sequence[str]) -> dict[str, NodeView]:
        """Each node's cordon, our taint and reason; a missing node has exists=False."""
        out: dict[str, NodeView] = {}
        try:
            for name in nodes:
                try:
                    node = await self.client.get_node(name)
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
            node = await self.client.get_node(name)
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
            raise node_error(f"PATCH node {name}", status, body)
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
        await self._set_condition(node, decision)

    async def _set_condition(self, node: Mapping[str, Any], decision: Decision) -> None:
        """Write the RackguardThermal condition; a failure is a WARNING and a Warning Event."""
        name = decision.node
        condition = condition_for(node, decision, _kube_time())
        path = f"/api/v1/nodes/{quote(name, safe='')}/status"
        try:
            status, body = await self._call(
                "PATCH",
                path,
                {"status": {"conditions": [condition]}},
                content_type=STRATEGIC_MERGE,
            )
        except DeliveryError as err:
            status, body = 0, str(err)
        if status == 200:
            return
        problem = node_error(f"PATCH node {name} status", status, body) if status else body
        log.warning("%s: condition %s not set: %s", name, CONDITION_TYPE, problem)
        if self._events:
            try:
                await self._record_event(
                    node,
                    decision,
                    reason="RackguardConditionNotSet",
                    message=f"condition {CONDITION_TYPE} not set: {problem}"[:1024],
                    warning=True,
                )
            except DeliveryError as err:
                log.warning("%s: could not record the Event: %s", name, err)

    async def _record_event(
        self,
        node: Mapping[str, Any],
        decision: Decision,
        *,
        reason: str = "",
        message: str = "",
        warning: bool = False,
    ) -> None:
        meta = node.get("metadata", {})
        now = _kube_time()
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": "rackguard-", "namespace": self._event_ns},
            "involvedObject": {
                "kind": "Node",
                "name": meta.get("name"),
                "uid": meta.get("uid", ""),
            },
            "reason": reason or f"Rackguard{decision.action.value.capitalize()}",
            "message": message or decision.reason,
            "type": "Warning" if warning or decision.action is not Action.RESUME else "Normal",
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
        """Stop the watch, close the HTTP session."""
        await self.watch.stop()
        await self.client.close()
