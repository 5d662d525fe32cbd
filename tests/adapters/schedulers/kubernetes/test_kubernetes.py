"""The Kubernetes sink against the fake API server over HTTP: cordon and taints without
clobbering, resourceVersion races, exclusion as NoSchedule or NoExecute, foreign cordons.

The pods' notice and eviction are in test_kube_pods.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Literal

import pytest
from aiohttp import ClientSession

from adapters.base import DeliveryError
from adapters.schedulers.kubernetes.client import SA_DIR, KubeAuthError, KubeClient, connection
from adapters.schedulers.kubernetes.sink import FOREIGN_CORDON, KubernetesSink
from daemon.config import ConfigError, parse_config
from daemon.config.scheduler import KubernetesSchedulerConfig
from daemon.delivery.outbox import Status
from fakes.kube_api import FakeKubeApi
from policies.model import REASON_PREFIX, Action, Decision, FaultDomain, idempotency_key
from tests.support.delivery import StoreAndDeliverer as Outbox
from tests.support.secrets import write_secret
from tests.support.wait import wait_until

KEY = "rackguard.io/thermal"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def decision(node: str, action: Action, epoch: int = 1) -> Decision:
    return Decision(
        node,
        action,
        f"{REASON_PREFIX} kube {action}",
        FaultDomain.GPU,
        0.0,
        idempotency_key(node, action, epoch),
    )


@pytest.fixture
async def api() -> AsyncIterator[FakeKubeApi]:
    fake = FakeKubeApi()
    fake.add_node("node-a", taints=[GPU_TAINT])
    fake.add_node("node-b")
    await fake.start()
    yield fake
    await fake.stop()


def make_sink(
    api: FakeKubeApi, token_file: Path, *, exclude_state: Literal["drain", "down"] = "down"
) -> KubernetesSink:
    conn = connection(api_url=api.url, token_file=token_file)
    return KubernetesSink(KubeClient(conn), exclude_state=exclude_state)


@pytest.fixture
async def sink(api: FakeKubeApi, token_file: Path) -> AsyncIterator[KubernetesSink]:
    s = make_sink(api, token_file)
    yield s
    await s.close()


def our_taints(api: FakeKubeApi, node: str) -> list[str]:
    return [t["effect"] for t in api.nodes[node]["spec"].get("taints", []) if t["key"] == KEY]


async def test_drain_cordons_and_taints_without_dropping_other_taints(
    api: FakeKubeApi, sink: KubernetesSink
) -> None:
    await sink.deliver(decision("node-a", Action.DRAIN))
    node = api.nodes["node-a"]
    assert node["spec"]["unschedulable"] is True
    assert GPU_TAINT in node["spec"]["taints"] and our_taints(api, "node-a") == ["NoSchedule"]
    ann = node["metadata"]["annotations"]
    assert ann["rackguard.io/reason"] == "rackguard[gpu]: kube drain"
    assert ann["node.alpha.kubernetes.io/ttl"] == "0"  # others' annotations kept
    (event,) = api.events
    assert event["involvedObject"]["name"] == "node-a" and event["reason"] == "RackguardDrain"
    view = (await sink.read_state(["node-a"]))["node-a"]
    assert view.drained and view.ours and not view.down
    # The patch was a JSON Patch guarded by the resourceVersion it was built from.
    _, ctype, ops = api.patches[-1]
    assert ctype == "application/json-patch+json" and ops[0]["op"] == "test"


async def test_a_concurrent_change_is_retried_and_kept(
    api: FakeKubeApi, sink: KubernetesSink
) -> None:
    api.race_next_patch = 2  # someone adds a taint just before each of our next two patches
    await sink.deliver(decision("node-a", Action.DRAIN))
    taints = {t["key"] for t in api.nodes["node-a"]["spec"]["taints"]}
    racers = {k for k in taints if k.startswith("other.io/racer-")}
    assert sink.conflicts == 2 and len(racers) == 2
    assert {"nvidia.com/gpu", KEY} <= taints


async def test_exclude_then_resume_undo_only_our_changes(
    api: FakeKubeApi, sink: KubernetesSink
) -> None:
    await sink.deliver(decision("node-a", Action.DRAIN))
    await sink.deliver(decision("node-a", Action.EXCLUDE))
    assert our_taints(api, "node-a") == ["NoExecute"]
    view = (await sink.read_state(["node-a"]))["node-a"]
    assert view.down and view.satisfies(Action.EXCLUDE) and not view.satisfies(Action.DRAIN)
    await sink.deliver(decision("node-a", Action.RESUME))
    node = api.nodes["node-a"]
    assert node["spec"]["taints"] == [GPU_TAINT] and node["spec"]["unschedulable"] is False
    assert not any(k.startswith("rackguard.io/") for k in node["metadata"]["annotations"])
    assert not (await sink.read_state(["node-a"]))["node-a"].held


async def test_a_node_cordoned_by_someone_else_is_left_alone(
    api: FakeKubeApi, sink: KubernetesSink, tmp_path: Path
) -> None:
    api.edit_node("node-b", {"spec": {"unschedulable": True}})  # kubectl cordon node-b
    view = (await sink.read_state(["node-b"]))["node-b"]
    assert view.foreign and view.reason == FOREIGN_CORDON
    outbox = Outbox(tmp_path / "o.db", sink, retry_initial_s=0.01, retry_max_s=0.02)
    task = asyncio.create_task(outbox.run())
    try:
        outbox.submit(decision("node-b", Action.DRAIN))
        await wait_until(lambda: not outbox.pending())
        assert [r.status for r in (await outbox.history())] == [Status.SKIPPED]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        outbox.close()
    assert api.patches == [] and api.nodes["node-b"]["spec"]["unschedulable"] is True


async def test_an_exclusion_by_default_is_a_noschedule_taint_pods_are_not_evicted_at_once(
    api: FakeKubeApi, token_file: Path
) -> None:
    api.add_pod("ml", "trainer-0", "node-a")
    sink = make_sink(api, token_file, exclude_state="drain")
    try:
        await sink.deliver(decision("node-a", Action.EXCLUDE))
        taint = next(t for t in api.nodes["node-a"]["spec"]["taints"] if t["key"] == KEY)
        assert taint == {"key": KEY, "value": "exclude", "effect": "NoSchedule"}
        view = (await sink.read_state(["node-a"]))["node-a"]
        assert view.satisfies(Action.EXCLUDE, exclude_down=sink.exclude_down)
        assert not sink.exclude_down and not view.down
    finally:
        await sink.close()
    assert not api.evictions and ("ml", "trainer-0") in api.pods


async def test_errors_map_to_permanent_or_transient(
    api: FakeKubeApi, sink: KubernetesSink, tmp_path: Path
) -> None:
    with pytest.raises(DeliveryError) as missing:
        await sink.deliver(decision("node-z", Action.DRAIN))
    assert missing.value.permanent and "no such Kubernetes node" in str(missing.value)
    assert not (await sink.read_state(["node-z"]))["node-z"].exists
    api.forbid_patch = True
    with pytest.raises(DeliveryError) as forbidden:
        await sink.deliver(decision("node-a", Action.DRAIN))
    assert forbidden.value.permanent and "403" in str(forbidden.value)
    wrong = tmp_path / "wrong"
    write_secret(wrong, "nope")
    bad = KubernetesSink(KubeClient(connection(api_url=api.url, token_file=wrong)))
    try:
        with pytest.raises(DeliveryError) as unauthorized:
            await bad.deliver(decision("node-a", Action.DRAIN))
    finally:
        await bad.close()
    # Operator-fixable (a token to rotate): retried slowly, never final.
    assert unauthorized.value.reason == "auth" and "401" in str(unauthorized.value)
    assert unauthorized.value.permanent and not unauthorized.value.final
    assert missing.value.reason == "not_found" and not missing.value.final
    assert forbidden.value.reason == "auth"


async def test_the_fake_enforces_real_patch_semantics(api: FakeKubeApi) -> None:
    url = f"{api.url}/api/v1/nodes/node-a"
    headers = {"Authorization": "Bearer test-token"}
    ours = {"key": KEY, "effect": "NoSchedule"}
    stale = api.nodes["node-a"]["metadata"]["resourceVersion"]
    async with ClientSession(headers=headers) as http:
        test_failed = [
            {"op": "test", "path": "/metadata/resourceVersion", "value": "1"},
            {"op": "add", "path": "/spec/unschedulable", "value": True},
        ]
        async with http.patch(
            url, json=test_failed, headers={"Content-Type": "application/json-patch+json"}
        ) as resp:
            assert resp.status == 422
        assert "unschedulable" not in api.nodes["node-a"]["spec"]  # all or nothing
        merge = {"spec": {"taints": [ours]}}
        async with http.patch(
            url, json=merge, headers={"Content-Type": "application/strategic-merge-patch+json"}
        ) as resp:
            assert resp.status == 200
        # No merge key on taints: the GPU taint is gone. This is why the sink never does this.
        assert api.nodes["node-a"]["spec"]["taints"] == [ours]
        stale_merge = {"metadata": {"resourceVersion": stale}, "spec": {"unschedulable": True}}
        async with http.patch(
            url, json=stale_merge, headers={"Content-Type": "application/merge-patch+json"}
        ) as resp:
            assert resp.status == 409


def test_connection_from_kubeconfig_and_in_cluster(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        """
apiVersion: v1
kind: Config
current-context: ops
clusters:
- name: prod
  cluster: {server: "https://10.0.0.1:6443/", insecure-skip-tls-verify: true}
users:
- name: rg
  user: {token: abc123}
contexts:
- name: ops
  context: {cluster: prod, user: rg}
"""
    )
    conn = connection(kubeconfig=kubeconfig)
    assert conn.api_url == "https://10.0.0.1:6443" and conn.token() == "abc123"
    assert conn.ssl is False
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    token = tmp_path / "sa-token"
    write_secret(token, "sa\n")
    in_cluster = connection(token_file=token, environ=env, insecure_skip_tls_verify=True)
    assert in_cluster.api_url == "https://10.96.0.1:443" and in_cluster.token() == "sa"
    if not (SA_DIR / "ca.crt").exists():  # not inside a pod
        with pytest.raises(KubeAuthError, match="cannot load the cluster CA"):
            connection(token_file=token, environ=env)
    with pytest.raises(KubeAuthError, match="not in a cluster"):
        connection(environ={})


@pytest.fixture
def kube_toml(tmp_path: Path, token_file: Path) -> Iterator[str]:
    yield f"""
[node]
name = "node-a"
[sources.gpus]
type = "nvml"
[scheduler]
type = "kubernetes"
api_url = "https://10.0.0.1:6443"
token_file = "{token_file}"
evict_on_drain = true
"""


def test_kubernetes_config_loads_and_names_problems(kube_toml: str) -> None:
    cfg = parse_config(kube_toml).scheduler
    assert isinstance(cfg, KubernetesSchedulerConfig)
    assert cfg.evicts and cfg.taint_key == KEY and cfg.outbox_path is None
    assert cfg.exclude_state == "drain"  # NoSchedule + notice + eviction after the grace
    # The former key still says what it said: false is no eviction.
    assert not parse_config(kube_toml.replace("= true", "= false")).scheduler.evicts  # type: ignore[union-attr]
    with pytest.raises(ConfigError) as info:
        parse_config(kube_toml + 'taint_key = "bad key!"\n')
    assert "scheduler.taint_key: not a valid taint key" in str(info.value)
    # What `run` would refuse, check-config names by key (exit 2), not at start-up.
    no_token = "\n".join(line for line in kube_toml.splitlines() if "token_file" not in line)
    with pytest.raises(ConfigError) as info:
        parse_config(no_token)
    assert "scheduler.token_file: required with api_url" in str(info.value)
    with pytest.raises(ConfigError) as info:
        parse_config(kube_toml + 'ca_file = "/nonexistent/ca.crt"\n')
    assert "scheduler.ca_file: file '/nonexistent/ca.crt' does not exist" in str(info.value)


READY = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet ok"}


def thermal(api: FakeKubeApi, node: str) -> dict[str, str] | None:
    conditions = api.nodes[node].get("status", {}).get("conditions", [])
    return next((c for c in conditions if c["type"] == "RackguardThermal"), None)


async def test_node_condition_says_why_on_drain_exclude_and_resume(
    api: FakeKubeApi, sink: KubernetesSink
) -> None:
    api.nodes["node-a"]["status"] = {"conditions": [READY], "capacity": {"cpu": "64"}}
    await sink.deliver(decision("node-a", Action.DRAIN))
    cond = thermal(api, "node-a")
    assert cond is not None
    assert (cond["status"], cond["reason"]) == ("True", "ThermalDrain")
    assert cond["message"] == "rackguard[gpu]: kube drain"
    assert cond["lastTransitionTime"].endswith("Z") and cond["lastHeartbeatTime"]
    # Through the status subresource, a strategic merge by type: the kubelet's kept.
    (name, body), *_ = api.status_patches
    assert name == "node-a" and list(body) == ["status"]
    assert READY in api.nodes["node-a"]["status"]["conditions"]
    assert api.nodes["node-a"]["status"]["capacity"] == {"cpu": "64"}

    cond["lastTransitionTime"] = "2020-01-01T00:00:00Z"  # as if set long ago
    await sink.deliver(decision("node-a", Action.EXCLUDE))
    cond = thermal(api, "node-a")
    assert cond is not None and (cond["status"], cond["reason"]) == ("True", "ThermalExclude")
    assert cond["lastTransitionTime"] == "2020-01-01T00:00:00Z"  # still True: no transition

    await sink.deliver(decision("node-a", Action.RESUME))
    cond = thermal(api, "node-a")
    assert cond is not None and (cond["status"], cond["reason"]) == ("False", "ThermalOK")
    assert cond["lastTransitionTime"] != "2020-01-01T00:00:00Z"
    assert [c["type"] for c in api.nodes["node-a"]["status"]["conditions"]] == [
        "Ready",
        "RackguardThermal",
    ]


async def draino_candidates(api: FakeKubeApi, conditions: set[str]) -> set[str]:
    """What draino (--node-conditions) or a medik8s NodeHealthCheck selects: the nodes with
    one of ``conditions`` at status True, read from the node list as they read it."""
    async with (
        ClientSession(headers={"Authorization": f"Bearer {api.token}"}) as http,
        http.get(f"{api.url}/api/v1/nodes") as resp,
    ):
        items = (await resp.json())["items"]
    return {
        n["metadata"]["name"]
        for n in items
        for c in n.get("status", {}).get("conditions", [])
        if c["type"] in conditions and c["status"] == "True"
    }


async def test_node_condition_is_what_a_draino_style_consumer_selects_on(
    api: FakeKubeApi, sink: KubernetesSink
) -> None:
    wanted = {"RackguardThermal"}
    assert await draino_candidates(api, wanted) == set()
    await sink.deliver(decision("node-a", Action.DRAIN))
    assert await draino_candidates(api, wanted) == {"node-a"}
    await sink.deliver(decision("node-a", Action.RESUME))
    assert await draino_candidates(api, wanted) == set()  # False: no longer selected


async def test_node_condition_refused_is_a_warning_and_an_event_not_a_failed_drain(
    api: FakeKubeApi, sink: KubernetesSink, caplog: pytest.LogCaptureFixture
) -> None:
    api.forbid.add("patch nodes/status")  # a ClusterRole without nodes/status
    await sink.deliver(decision("node-a", Action.DRAIN))
    assert our_taints(api, "node-a") == ["NoSchedule"]  # the drain itself went through
    assert thermal(api, "node-a") is None
    assert "node-a: condition RackguardThermal not set: " in caplog.text
    assert 'cannot patch resource "nodes/status"' in caplog.text
    warning = [e for e in api.events if e["reason"] == "RackguardConditionNotSet"]
    assert len(warning) == 1 and warning[0]["type"] == "Warning"
    assert warning[0]["involvedObject"]["name"] == "node-a"


async def test_node_condition_patch_must_be_a_strategic_merge_in_the_fake(
    api: FakeKubeApi,
) -> None:
    headers = {"Authorization": f"Bearer {api.token}"}
    async with ClientSession(headers=headers) as http:
        url = f"{api.url}/api/v1/nodes/node-a/status"
        async with http.patch(url, json={"status": {}}) as resp:
            assert resp.status == 415  # application/json is not a patch type
        body = b'{"status": {"conditions": [{"status": "True"}]}}'
        smp = {"Content-Type": "application/strategic-merge-patch+json"}
        async with http.patch(url, data=body, headers=smp) as resp:
            assert resp.status == 422  # a condition without its merge key
        delete = b'{"status": {"conditions": [{"type": "X", "$patch": "delete"}]}}'
        async with http.patch(url, data=delete, headers=smp) as resp:
            assert resp.status == 200
        async with http.patch(f"{api.url}/api/v1/nodes/nope/status", data=body, headers=smp) as r:
            assert r.status == 404
