"""A Kubernetes node label (``rackguard.io/thermal-headroom``) for a preferred node affinity.

- read: ``GET /api/v1/nodes/{name}``, ``metadata.labels[key]``;
- write: one JSON Patch that first ``test``s the label's current value (or, when
  it is absent, the node's ``resourceVersion``), then sets or removes it. A
  change by anyone in between fails the test (422) or conflicts (409): the label
  is left as it is (SettingChanged), never overwritten.

Key and value are checked as the API server checks them (apimachinery
``pkg/util/validation/validation.go``: IsQualifiedName for the key, an optional
DNS-1123 subdomain prefix of at most 253 characters and a name of at most 63;
IsValidLabelValue for the value, at most 63) before any write: a value the
server would refuse is never sent, and a 422 naming ``metadata.labels`` is an
invalid label (DeliveryError, final), not someone else's change.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from adapters.base import DeliveryError
from adapters.schedulers.kubernetes.client import JSON_PATCH, KubeClient, _ptr, node_error
from adapters.schedulers.node_setting import SettingChanged

_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
NAME_MAX = 63  # validation.QualifiedNameMaxLength, LabelValueMaxLength
PREFIX_MAX = 253  # validation.DNS1123SubdomainMaxLength


def label_key_problem(key: str) -> str:
    """Why the API server would refuse ``key`` as a label key ("" if it would not)."""
    parts = key.split("/")
    if len(parts) > 2:
        return "a qualified name has at most one '/' (an optional DNS subdomain prefix)"
    if len(parts) == 2:
        prefix = parts[0]
        if not prefix:
            return "prefix part must be non-empty"
        if len(prefix) > PREFIX_MAX:
            return f"prefix part must be no more than {PREFIX_MAX} characters"
        if not _DNS1123_SUBDOMAIN.fullmatch(prefix):
            return "prefix part must be a lowercase RFC 1123 subdomain"
    name = parts[-1]
    if not name:
        return "name part must be non-empty"
    if len(name) > NAME_MAX:
        return f"name part must be no more than {NAME_MAX} characters"
    if not _QUALIFIED_NAME.fullmatch(name):
        return (
            "name part must consist of alphanumeric characters, '-', '_' or '.',"
            " and must start and end with an alphanumeric character"
        )
    return ""


def label_value_problem(value: str) -> str:
    """Why the API server would refuse ``value`` as a label value ("" if it would not)."""
    if len(value) > NAME_MAX:
        return f"must be no more than {NAME_MAX} characters"
    if value and not _QUALIFIED_NAME.fullmatch(value):
        return (
            "must be empty or consist of alphanumeric characters, '-', '_' or '.',"
            " and must start and end with an alphanumeric character"
        )
    return ""


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

    def writable(self, value: str | None) -> bool:
        """Unset, or a value the API server takes."""
        return value is None or not label_value_problem(value)

    async def read(self, node: str) -> str | None:
        """The label's value, None when the node has no such label."""
        labels = (await self._node(node)).get("metadata", {}).get("labels") or {}
        value = labels.get(self._key)
        return str(value) if value is not None else None

    async def write(self, node: str, value: str | None, expected: str | None) -> None:
        """Set (or remove, for None) the label where it still is ``expected``."""
        if value is None and expected is None:
            return
        problem = label_key_problem(self._key) or (
            label_value_problem(value) if value is not None else ""
        )
        if problem:
            raise DeliveryError(
                f"{node}: label {self._key}={value!r} is invalid: {problem}",
                final=True,
                reason="invalid",
            )
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
        message = body.get("message", "") if isinstance(body, dict) else str(body)
        if status == 422 and "metadata.labels" in str(message):
            # The server's validation, not a failed test: asking again cannot help.
            raise DeliveryError(
                f"{node}: label {self._key}={value!r} is invalid: HTTP 422: {message}",
                final=True,
                reason="invalid",
            )
        if status in (409, 422):
            raise SettingChanged(f"{node}: label {self._key} changed meanwhile: {message}")
        raise node_error(f"PATCH label {self._key} of {node}", status, body)
