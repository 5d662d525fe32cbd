"""Kubernetes as a backend: one KubeClient under every capability."""

from __future__ import annotations

from adapters.schedulers.base import EXCLUDE_STATE_DEFAULT, ExcludeState
from adapters.schedulers.jobs import JobHandling
from adapters.schedulers.kubernetes.client import KubeClient
from adapters.schedulers.kubernetes.label import KubeNodeLabel
from adapters.schedulers.kubernetes.pods import POD_NOTICE, KubePods
from adapters.schedulers.kubernetes.sink import KubernetesSink


class KubernetesBackend:
    """Cordon and taint, list nodes, tell and evict pods, a node label."""

    name = "kubernetes"

    def __init__(
        self,
        client: KubeClient,
        *,
        taint_key: str = "rackguard.io/thermal",
        exclude_state: ExcludeState = EXCLUDE_STATE_DEFAULT,
        record_events: bool = True,
        evict: bool = True,
    ) -> None:
        self.client = client
        self._sink = KubernetesSink(
            client, taint_key=taint_key, exclude_state=exclude_state, record_events=record_events
        )
        self._pods = JobHandling(KubePods(client, record_events=record_events), POD_NOTICE, evict)

    def sink(self) -> KubernetesSink:
        """Node cordons and taints; node reads."""
        return self._sink

    def lister(self) -> KubernetesSink:
        """The node list, with each node's rack label."""
        return self._sink

    def job_control(self) -> JobHandling:
        """An annotation and an Event on each pod, an eviction at the deadline."""
        return self._pods

    def node_setting(self, label_key: str) -> KubeNodeLabel:
        """The node label ``label_key``."""
        return KubeNodeLabel(self.client, label_key)
