"""The pods on a Kubernetes node as JobControl: list, tell (annotation + Event), evict.

- List: ``GET /api/v1/pods?fieldSelector=spec.nodeName=NODE``, less the pods
  ``kubectl drain`` leaves alone: DaemonSet-owned, mirror (static) pods, and pods
  already terminating, Succeeded or Failed. A pod's job id is ``namespace/name``.
- Tell: a merge patch (RFC 7386) sets the annotation
  ``rackguard.io/checkpoint-by`` to the deadline in RFC 3339 UTC, then a core/v1
  Event (reason ``ThermalCheckpointNotice``, type Warning) on the pod. Core v1,
  not events.k8s.io/v1: the node's Event already is one, so one API group and one
  RBAC rule; ``kubectl describe pod`` and ``kubectl get events`` show both kinds
  alike (the API server stores them as one resource). The Event names the pod's
  uid (taken from the patch's answer), as ``kubectl describe`` matches on it.
- Revise: a JSON Patch ``test`` of the annotation first: a pod that already
  carries the deadline is left alone (a restart, a retried pass); one that does
  not is told again (an exclusion brought the deadline forward). Taken back (a
  resume before the deadline): a JSON Patch ``remove`` of the annotation and a
  Normal Event ``ThermalCheckpointWithdrawn``; a pod without it has nothing to
  take back (422), and gets no Event.
- Evict: ``POST .../pods/NAME/eviction`` with a policy/v1 Eviction, which honours
  PodDisruptionBudgets: 429 is BLOCKED (asked again later, never forced with a
  delete), 404 is GONE (the pod left on its own). A pod no controller owns (a
  bare pod) would be gone for good, not started elsewhere: it is told, then left
  running (REFUSED, as a Slurm job that cannot be requeued; ``kubectl drain``
  wants ``--force`` for those).

A 403 (RBAC) is a permanent JobControlError (asked again slowly, reported); an
unreachable server or a 5xx a transient one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from adapters.base import DeliveryError
from adapters.schedulers.decision_json import rfc3339
from adapters.schedulers.jobs import JobControlError, NoticeTerms, Outcome, RunningJob
from adapters.schedulers.kubernetes import KubeClient, api_message

log = logging.getLogger(__name__)

CHECKPOINT_ANNOTATION = "rackguard.io/checkpoint-by"
EVENT_REASON = "ThermalCheckpointNotice"
WITHDRAWN_REASON = "ThermalCheckpointWithdrawn"
# How a pod is told, as the notice records it (NoticeSettings.signal).
POD_NOTICE = "annotation"
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
_ANNOTATION_PTR = "/metadata/annotations/" + CHECKPOINT_ANNOTATION.replace("/", "~1")
_RBAC = "the account needs list on pods, patch on pods, create on pods/eviction and events"


def evictable(pod: Mapping[str, Any]) -> bool:
    """Pods ``kubectl drain`` would evict: not DaemonSet-owned, not mirror, not finished."""
    meta = pod.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return False
    if "kubernetes.io/config.mirror" in (meta.get("annotations") or {}):
        return False
    if any(o.get("kind") == "DaemonSet" for o in meta.get("ownerReferences") or []):
        return False
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def _split(job: RunningJob) -> tuple[str, str]:
    ns, _, name = job.job_id.partition("/")
    return ns, name


def _pod_path(ns: str, name: str) -> str:
    return f"/api/v1/namespaces/{quote(ns, safe='')}/pods/{quote(name, safe='')}"


class KubePods:
    """JobControl for the pods of a node, through the API server."""

    def __init__(self, client: KubeClient, *, record_events: bool = True) -> None:
        self.name = "kubernetes"
        self._client = client
        self._events = record_events
        self._bare: set[str] = set()  # job ids of the pods no controller owns, as last listed

    async def _call(
        self, what: str, method: str, path: str, body: Any, ctype: str
    ) -> tuple[int, Any]:
        try:
            status, answer = await self._client.call(method, path, body, content_type=ctype)
        except DeliveryError as err:
            raise JobControlError(f"{what}: {err}") from err
        return status, answer

    @staticmethod
    def _error(what: str, status: int, body: Any) -> JobControlError:
        said = f"{what}: HTTP {status}: {api_message(body)}"
        if status in (401, 403):
            return JobControlError(f"{said} ({_RBAC})", permanent=True)
        # Other 4xx are not fixed by asking again soon; 5xx, 408/409/425/429 are.
        slow = 400 <= status < 500 and status not in (408, 409, 425, 429)
        return JobControlError(said, permanent=slow)

    async def running(self, node: str) -> list[RunningJob]:
        """The evictable pods bound to ``node``."""
        selector = quote(f"spec.nodeName={node}", safe="=")
        what = f"list pods on {node}"
        status, body = await self._call(
            what, "GET", f"/api/v1/pods?fieldSelector={selector}", None, "application/json"
        )
        if status != 200 or not isinstance(body, dict):
            raise self._error(what, status, body)
        jobs = []
        self._bare.clear()
        for pod in body.get("items") or []:
            if not isinstance(pod, dict) or not evictable(pod):
                continue
            meta = pod.get("metadata") or {}
            ns, name = str(meta.get("namespace") or "default"), str(meta.get("name") or "")
            if name:
                jobs.append(RunningJob(f"{ns}/{name}", name, ns))
                owners = meta.get("ownerReferences") or []
                if not any(isinstance(o, dict) and o.get("controller") for o in owners):
                    self._bare.add(f"{ns}/{name}")
        return jobs

    async def notify(self, job: RunningJob, terms: NoticeTerms) -> tuple[Outcome, str]:
        """Annotate the pod with its deadline, then record an Event on it."""
        ns, name = _split(job)
        deadline = rfc3339(terms.checkpoint_by)
        patch = {"metadata": {"annotations": {CHECKPOINT_ANNOTATION: deadline}}}
        what = f"annotate pod {job.job_id}"
        status, pod = await self._call(what, "PATCH", _pod_path(ns, name), patch, MERGE_PATCH)
        if status == 404:
            return Outcome.GONE, "pod not found"
        if status != 200 or not isinstance(pod, dict):
            raise self._error(what, status, pod)
        message = f"checkpoint by {deadline}: {terms.reason} (fault domain: {terms.domain})"
        return Outcome.DONE, "annotated" + await self._event(job, pod, EVENT_REASON, message)

    async def revise(self, job: RunningJob, terms: NoticeTerms | None) -> tuple[Outcome, str]:
        """Tell the pod ``terms`` unless its annotation already says so; None: take it back."""
        ns, name = _split(job)
        path = _pod_path(ns, name)
        if terms is None:
            what = f"take back the notice of pod {job.job_id}"
            ops = [{"op": "remove", "path": _ANNOTATION_PTR}]
        else:
            what = f"check the notice of pod {job.job_id}"
            ops = [{"op": "test", "path": _ANNOTATION_PTR, "value": rfc3339(terms.checkpoint_by)}]
        status, pod = await self._call(what, "PATCH", path, ops, JSON_PATCH)
        if status == 404:
            return Outcome.GONE, "pod not found"
        if status == 422:  # the test failed / nothing to remove
            if terms is None:
                return Outcome.DONE, "no annotation to take back"
            return await self.notify(job, terms)
        if status != 200 or not isinstance(pod, dict):
            raise self._error(what, status, pod)
        if terms is not None:
            return Outcome.DONE, "already told"
        message = "the node is back in service: no checkpoint needed"
        return Outcome.DONE, "annotation removed" + await self._event(
            job, pod, WITHDRAWN_REASON, message, warning=False
        )

    async def _event(
        self,
        job: RunningJob,
        pod: Mapping[str, Any],
        reason: str,
        message: str,
        *,
        warning: bool = True,
    ) -> str:
        """Record an Event on the pod; what to add to the outcome's words."""
        if not self._events:
            return ""
        ns, name = _split(job)
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        event = _event(ns, name, uid, reason, message, warning)
        path = f"/api/v1/namespaces/{quote(ns, safe='')}/events"
        try:
            status, body = await self._client.call("POST", path, event)
        except DeliveryError as err:
            status, body = 0, {"message": str(err)}
        if status not in (200, 201):
            # The annotation is the notice; the Event is for people reading kubectl.
            log.warning(
                "pod %s: Event %s not recorded: HTTP %d %s",
                job.job_id,
                reason,
                status,
                api_message(body),
            )
            return f"; Event not recorded (HTTP {status})"
        return ", Event recorded"

    async def requeue(self, job: RunningJob) -> tuple[Outcome, str]:
        """Evict the pod (policy/v1 Eviction): its controller starts it elsewhere."""
        if job.job_id in self._bare:
            return Outcome.REFUSED, "no controller would start it again (a bare pod)"
        ns, name = _split(job)
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": ns},
        }
        what = f"evict pod {job.job_id}"
        status, answer = await self._call(
            what, "POST", _pod_path(ns, name) + "/eviction", body, "application/json"
        )
        if status in (200, 201):
            return Outcome.DONE, "evicted"
        if status == 404:
            return Outcome.GONE, "pod already gone"
        if status == 429:  # a PodDisruptionBudget allows no disruption now
            return Outcome.BLOCKED, f"HTTP 429: {_budget_words(answer)}"
        raise self._error(what, status, answer)

    async def close(self) -> None:
        """Close the HTTP session."""
        await self._client.close()


def _budget_words(body: Any) -> str:
    causes = (body.get("details") or {}).get("causes") if isinstance(body, dict) else None
    words = [str(c.get("message", "")) for c in causes or [] if isinstance(c, dict)]
    return "; ".join([api_message(body), *[w for w in words if w]])


def _event(
    ns: str, name: str, uid: str, reason: str, message: str, warning: bool
) -> dict[str, Any]:
    now = rfc3339(time.time())
    involved = {"apiVersion": "v1", "kind": "Pod", "namespace": ns, "name": name}
    if uid:
        involved["uid"] = uid
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": "rackguard-checkpoint-", "namespace": ns},
        "involvedObject": involved,
        "reason": reason,
        "message": message,
        "type": "Warning" if warning else "Normal",
        "source": {"component": "rackguard"},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
