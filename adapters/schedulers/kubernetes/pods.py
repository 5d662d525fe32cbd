"""The pods on a Kubernetes node as JobControl: list, tell (annotation + Event), evict.

- List: ``GET /api/v1/pods?fieldSelector=spec.nodeName=NODE&limit=500``, page by
  page (``continue``; an expired token, 410, starts the list again), less the
  pods ``kubectl drain`` leaves alone (kubectl ``pkg/drain/filters.go``): mirror
  (static) pods, pods already terminating, Succeeded or Failed, and DaemonSet
  pods — by the *controller* owner reference only (``controller: true``), an
  apps/v1 DaemonSet that exists (``GET /apis/apps/v1/.../daemonsets/NAME``,
  same uid). Any other owner reference saying "DaemonSet" (not the controller,
  another API group) dodges nothing; a pod whose DaemonSet is gone is an orphan
  nothing restarts: told, and left running like a bare pod. Each pod's own
  ``spec.nodeName`` must name the node (a proxy may drop the selector). A pod's
  job id is ``namespace/name``; its uid, as listed, goes with it. A list that
  cannot be read whole (a page missing, a pod without a valid name or uid) is
  an error: nothing is told or evicted from part of a list.
- The pod acted on is the pod listed: a pod's ``spec.nodeName`` and
  ``metadata.uid`` cannot change, so every write carries them as a
  precondition. The annotation's merge patch restates both (the API server
  refuses a patch that would change either, 422); the JSON Patches ``test``
  them first; the eviction names the uid in ``deleteOptions.preconditions``
  (409 if the pod of that name is another one). A pod replaced by one of the
  same name, on this node or another, is GONE, never touched.
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
from adapters.schedulers.kubernetes.client import JSON_PATCH, KubeClient, api_message

log = logging.getLogger(__name__)

CHECKPOINT_ANNOTATION = "rackguard.io/checkpoint-by"
EVENT_REASON = "ThermalCheckpointNotice"
WITHDRAWN_REASON = "ThermalCheckpointWithdrawn"
# How a pod is told, as the notice records it (NoticeSettings.signal).
POD_NOTICE = "annotation"
MERGE_PATCH = "application/merge-patch+json"
_ANNOTATION_PTR = "/metadata/annotations/" + CHECKPOINT_ANNOTATION.replace("/", "~1")
_RBAC = (
    "the account needs list on pods, patch on pods, create on pods/eviction and events,"
    " get on daemonsets.apps"
)
# kubernetes pkg/registry/core/pod/storage/eviction.go: a 500 no retry fixes.
TWO_BUDGETS = "more than one PodDisruptionBudget"
PAGE_SIZE = 500
LIST_RESTARTS = 3  # an expired continue token (410) starts the list again, this often
NOT_HERE = "not the pod listed on this node any more (replaced or moved)"
# Names that would address another object once in a URL path (quoting keeps the rest).
_NOT_A_NAME = ("", ".", "..")


def evictable(pod: Mapping[str, Any]) -> bool:
    """Pods ``kubectl drain`` would evict, DaemonSets aside: not mirror, not finished."""
    meta = pod.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return False
    if "kubernetes.io/config.mirror" in (meta.get("annotations") or {}):
        return False
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def controller_of(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The owner reference with ``controller: true`` (metav1.GetControllerOf), if any."""
    for owner in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(owner, dict) and owner.get("controller") is True:
            return owner
    return None


def daemonset_of(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """(name, uid) of the apps/v1 DaemonSet the pod's controller reference names, if it does."""
    owner = controller_of(pod)
    if owner is None or (owner.get("apiVersion"), owner.get("kind")) != ("apps/v1", "DaemonSet"):
        return None
    name, uid = owner.get("name"), owner.get("uid")
    if not isinstance(name, str) or name in _NOT_A_NAME:
        return None  # names no DaemonSet: nothing that would start it again
    return name, uid if isinstance(uid, str) else ""


def _listed(pod: Mapping[str, Any], node: str) -> RunningJob | None:
    """An evictable pod on ``node`` as a RunningJob; None for one to leave alone.

    Raises JobControlError for a pod that cannot be named (a list not read whole).
    """
    spec = pod.get("spec") or {}
    if not isinstance(spec, dict) or spec.get("nodeName") != node:
        return None  # the field selector was not applied: not this node's pod
    meta = pod.get("metadata") or {}
    try:
        if not isinstance(meta, dict):
            raise TypeError("metadata is not an object")
        if not isinstance(meta.get("ownerReferences") or [], list):
            raise TypeError("ownerReferences is not a list")
        if not evictable(pod):
            return None
    except (AttributeError, TypeError) as err:  # metadata or owners of another shape
        raise JobControlError(f"list pods on {node}: a malformed pod", reason="malformed") from err
    ns, name, uid = meta.get("namespace"), meta.get("name"), meta.get("uid")
    for value in (ns, name, uid):
        if not isinstance(value, str) or not value:
            raise JobControlError(
                f"list pods on {node}: a pod without a namespace, name or uid", reason="malformed"
            )
    assert isinstance(ns, str) and isinstance(name, str) and isinstance(uid, str)
    if ns in _NOT_A_NAME or name in _NOT_A_NAME or "/" in ns or len(uid) > 128:
        raise JobControlError(
            f"list pods on {node}: a pod named {ascii(ns)[:80]}/{ascii(name)[:80]}"
            " that would address another object",
            reason="malformed",
        )
    return RunningJob(f"{ns}/{name}", name, ns, node=node, uid=uid)


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
        self._warned_daemonsets = False  # a 403 on DaemonSets said once

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
            if "admission webhook" in said:  # a policy of that namespace, not our RBAC
                return JobControlError(said, permanent=True, reason="admission")
            return JobControlError(f"{said} ({_RBAC})", permanent=True)
        # Other 4xx are not fixed by asking again soon; 5xx, 408/409/425/429 are.
        slow = 400 <= status < 500 and status not in (408, 409, 425, 429)
        return JobControlError(said, permanent=slow, reason="invalid" if status == 422 else "")

    async def running(self, node: str) -> list[RunningJob]:
        """The evictable pods bound to ``node``, from a list read whole."""
        for _ in range(LIST_RESTARTS):
            pods = await self._list_pods(node)
            if pods is not None:
                break
        else:
            raise JobControlError(
                f"list pods on {node}: the list kept expiring between pages (410)",
                reason="incomplete",
            )
        jobs = []
        bare = set()
        daemonsets: dict[tuple[str, str], str | None] = {}  # (ns, name) -> uid; None: gone
        for pod in pods:
            job = _listed(pod, node)
            if job is None:
                continue
            ds = daemonset_of(pod)
            if ds is not None:
                key = (job.user, ds[0])
                if key not in daemonsets:
                    daemonsets[key] = await self._daemonset_uid(*key)
                found = daemonsets[key]
                if found is not None and ("" in (found, ds[1]) or found == ds[1]):
                    continue  # a DaemonSet's pod: it would come straight back
                bare.add(job.job_id)  # an orphan: its DaemonSet is gone
            elif controller_of(pod) is None:
                bare.add(job.job_id)
            jobs.append(job)
        self._bare = bare
        return jobs

    async def _daemonset_uid(self, ns: str, name: str) -> str | None:
        """The uid of DaemonSet ``ns/name`` ("" if it shows none); None when it does not exist."""
        what = f"get DaemonSet {ns}/{name}"
        path = f"/apis/apps/v1/namespaces/{quote(ns, safe='')}/daemonsets/{quote(name, safe='')}"
        status, body = await self._call(what, "GET", path, None, "application/json")
        if status == 404:
            return None
        if status in (401, 403):
            # A ClusterRole from before this check: skip the pod as a DaemonSet's, as
            # before, rather than tell no pod of the node at all.
            if not self._warned_daemonsets:
                log.warning("%s: %s; pods owned by a DaemonSet are taken at its word", what, _RBAC)
                self._warned_daemonsets = True
            return ""
        if status != 200 or not isinstance(body, dict):
            raise self._error(what, status, body)
        uid = (body.get("metadata") or {}).get("uid")
        return uid if isinstance(uid, str) else ""

    async def _list_pods(self, node: str) -> list[dict[str, Any]] | None:
        """Every pod the API server lists on ``node``; None when a page expired (410)."""
        selector = quote(f"spec.nodeName={node}", safe="=")
        what = f"list pods on {node}"
        pods: list[dict[str, Any]] = []
        token = ""
        while True:
            path = f"/api/v1/pods?fieldSelector={selector}&limit={PAGE_SIZE}"
            if token:
                path += f"&continue={quote(token, safe='')}"
            status, body = await self._call(what, "GET", path, None, "application/json")
            if status == 410 and token:
                return None
            if status != 200 or not isinstance(body, dict):
                raise self._error(what, status, body)
            items = body.get("items")
            meta = body.get("metadata")
            if not isinstance(items, list) or not isinstance(meta, dict):
                raise JobControlError(f"{what}: not a PodList", reason="malformed")
            for pod in items:
                if not isinstance(pod, dict):
                    raise JobControlError(f"{what}: an item is not a pod", reason="malformed")
                pods.append(pod)
            token = meta.get("continue") or ""
            if not isinstance(token, str):
                raise JobControlError(f"{what}: a bad continue token", reason="malformed")
            if not token:
                return pods

    async def notify(self, job: RunningJob, terms: NoticeTerms) -> tuple[Outcome, str]:
        """Annotate the pod listed (its uid, on its node) with its deadline, then an Event."""
        if not (job.node and job.uid):
            return Outcome.GONE, NOT_HERE
        ns, name = _split(job)
        deadline = rfc3339(terms.checkpoint_by)
        # uid and nodeName restated: the API server refuses to change either (422),
        # so a pod of the same name that is not the one listed is never annotated.
        patch = {
            "metadata": {"uid": job.uid, "annotations": {CHECKPOINT_ANNOTATION: deadline}},
            "spec": {"nodeName": job.node},
        }
        what = f"annotate pod {job.job_id}"
        status, pod = await self._call(what, "PATCH", _pod_path(ns, name), patch, MERGE_PATCH)
        if status == 404:
            return Outcome.GONE, "pod not found"
        if status == 422 and not await self._still_listed(job):
            return Outcome.GONE, NOT_HERE
        if status != 200 or not isinstance(pod, dict):
            raise self._error(what, status, pod)
        message = f"checkpoint by {deadline}: {terms.reason} (fault domain: {terms.domain})"
        return Outcome.DONE, "annotated" + await self._event(job, pod, EVENT_REASON, message)

    async def _still_listed(self, job: RunningJob) -> bool:
        """Whether the pod listed (same uid) is still on its node."""
        for _ in range(LIST_RESTARTS):
            pods = await self._list_pods(job.node)
            if pods is not None:
                return any(
                    (listed := _listed(p, job.node)) is not None
                    and (listed.job_id, listed.uid) == (job.job_id, job.uid)
                    for p in pods
                )
        raise JobControlError(f"list pods on {job.node}: the list kept expiring (410)")

    async def revise(self, job: RunningJob, terms: NoticeTerms | None) -> tuple[Outcome, str]:
        """Tell the pod ``terms`` unless its annotation already says so; None: take it back."""
        if not job.node:
            return Outcome.GONE, NOT_HERE
        ns, name = _split(job)
        path = _pod_path(ns, name)
        # The pod on this node, and the one listed where its uid is known (a notice
        # carried over a restart keeps the node, not the uid).
        ops: list[dict[str, Any]] = [{"op": "test", "path": "/spec/nodeName", "value": job.node}]
        if job.uid:
            ops.append({"op": "test", "path": "/metadata/uid", "value": job.uid})
        if terms is None:
            what = f"take back the notice of pod {job.job_id}"
            ops.append({"op": "remove", "path": _ANNOTATION_PTR})
        else:
            what = f"check the notice of pod {job.job_id}"
            value = rfc3339(terms.checkpoint_by)
            ops.append({"op": "test", "path": _ANNOTATION_PTR, "value": value})
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
        if not (job.node and job.uid):
            return Outcome.GONE, NOT_HERE
        ns, name = _split(job)
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": ns},
            # The pod listed, not one recreated under its name since (409 if so).
            "deleteOptions": {"preconditions": {"uid": job.uid}},
        }
        what = f"evict pod {job.job_id}"
        status, answer = await self._call(
            what, "POST", _pod_path(ns, name) + "/eviction", body, "application/json"
        )
        if status in (200, 201):
            return Outcome.DONE, "evicted"
        if status == 404:
            return Outcome.GONE, "pod already gone"
        if status == 409:  # the uid precondition failed
            return Outcome.GONE, NOT_HERE
        if status == 429:  # a PodDisruptionBudget allows no disruption now
            return Outcome.BLOCKED, f"HTTP 429: {_budget_words(answer)}"
        if status == 500 and TWO_BUDGETS in api_message(answer):
            # Two budgets select the pod: the server will refuse it every time.
            raise JobControlError(
                f"{what}: HTTP 500: {api_message(answer)} (a person must fix the budgets)",
                permanent=True,
                reason="budgets",
            )
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
