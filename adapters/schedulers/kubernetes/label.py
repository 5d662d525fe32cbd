"""A Kubernetes node label (``rackguard.io/thermal-headroom``) for a preferred node affinity.

- read: ``GET /api/v1/nodes/{name}``, ``metadata.labels[key]``;
- write: one JSON Patch that first ``test``s the label's current value (or, when
  it is absent, the node's ``resourceVersion``), then sets or removes it. A
  change by anyone in between fails the test (422) or conflicts (409): the label
  is left as it is (SettingChanged), never overwritten.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from adapters.schedulers.kubernetes.client import JSON_PATCH, KubeClient, _ptr, node_error
from adapters.schedulers.node_setting import SettingChanged


class KubeNodeLabel:
    """One label of a node, through the backend's Kubernetes client."""

    def __init__(self, client: KubeClient, key: str) -> None:
        self._client = client
        self._key = key
        self.target = f"kubernetes label {key}"

    async def _node(self, node: str) -> dict[str, Any]:
        return await self._client.get_node(node)

    def value(self, bucket: int, weights: Sequence[int]) -> str:
        """The bucket's number: a preferred node affinity ranks by it."""
        return str(bucket)

    async def read(self, node: str) -> str | None:
        """The label's value, None when the node has no such label."""
        labels = (await self._node(node)).get("metadata", {}).get("labels") or {}
        value = labels.get(self._key)
        return str(value) if value is not None else None

    async def write(self, node: str, value: str | None, expected: str | None) -> None:
        """Set (or remove, for None) the label where it still is ``expected``."""
        if value is None and expected is None:
            return
        doc = await self._node(node)
        meta = doc.get("metadata", {})
        labels = meta.get("labels")
        path = _ptr("metadata", "labels", self._key)
        if expected is not None:
            ops: list[dict[str, Any]] = [{"op": "test", "path": path, "value": expected}]
        else:
            if isinstance(labels, dict) and self._key in labels:
                now = labels[self._key]
                raise SettingChanged(f"{node}: label {self._key} is {now!r}, not unset")
            version = meta["resourceVersion"]
            ops = [{"op": "test", "path": "/metadata/resourceVersion", "value": version}]
        if value is None:
            ops.append({"op": "remove", "path": path})
        elif isinstance(labels, dict):
            ops.append({"op": "add", "path": path, "value": value})
        else:
            ops.append({"op": "add", "path": "/metadata/labels", "value": {self._key: value}})
        status, body = await self._client.call(
            "PATCH", f"/api/v1/nodes/{quote(node, safe='')}", ops, content_type=JSON_PATCH
        )
        if status == 200:
            return
        if status in (409, 422):
            message = body.get("message", "") if isinstance(body, dict) else str(body)
            raise SettingChanged(f"{node}: label {self._key} changed meanwhile: {message}")
        raise node_error(f"PATCH label {self._key} of {node}", status, body)
