"""The whole daemon on Kubernetes: a hot GPU cordons the node, its pods are told, then evicted.

The real daemon in-process (config, sink, outbox, deliverer, notices, API) against
the fake API server over HTTP; only the NVML library is simulated.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp

from adapters.schedulers.kubernetes.pods import CHECKPOINT_ANNOTATION, EVENT_REASON
from daemon.app import Daemon
from fakes.kube_api import Budget, FakeKubeApi
from fakes.nvml import FakeNvml, fake_node
from tests.support.daemon_harness import config_text, running
from tests.support.secrets import write_secret
from tests.support.wait import wait_until

NODE = "gpu-node-07"


@contextlib.asynccontextmanager
async def daemon_on(api: FakeKubeApi, nvml: FakeNvml, tmp_path: Path) -> AsyncIterator[Daemon]:
    token = tmp_path / "kube.token"
    write_secret(token, "test-token\n")
    text = config_text("http://unused", token).replace(
        'type = "webhook"\nurl = "http://unused"\nsecret_file',
        f'type = "kubernetes"\napi_url = "{api.url}"\ntoken_file',
    )
    text += f'outbox_path = "{tmp_path / "o.db"}"\ncheckpoint_grace_s = 2.0\n'
    async with running(text, nvml) as daemon:
        yield daemon


async def test_a_hot_gpu_cordons_the_node_tells_its_pods_and_evicts_them_after_the_grace(
    tmp_path: Path,
) -> None:
    api = FakeKubeApi()
    api.add_node(NODE)
    api.add_pod("ml", "trainer-0", NODE, labels={"app": "trainer"})
    api.add_pod("kube-system", "dcgm-exporter", NODE, daemonset=True)
    budget = Budget(("app", "trainer"), disruptions_allowed=0)
    api.budgets.append(budget)
    await api.start()
    nvml = fake_node()
    for g in nvml.gpus:
        g.temperature_c = 60.0
    try:
        async with daemon_on(api, nvml, tmp_path) as daemon, aiohttp.ClientSession() as http:
            nvml.gpus[2].temperature_c = 87.0
            await wait_until(
                lambda: (
                    CHECKPOINT_ANNOTATION
                    in api.pods[("ml", "trainer-0")]["metadata"]["annotations"]
                ),
                what="the pod annotated",
            )
            assert api.nodes[NODE]["spec"]["unschedulable"] is True
            # The Event follows the annotation; wait for it rather than race it.
            await wait_until(lambda: bool(api.pod_events("ml", "trainer-0")), what="the pod Event")
            (event,) = api.pod_events("ml", "trainer-0")
            assert event["reason"] == EVENT_REASON
            url = f"http://127.0.0.1:{daemon.api_port}/v1/node/notice"
            async with http.get(url) as resp:
                notice = (await resp.json())["notice"]
            assert [j["job_id"] for j in notice["jobs"]] == ["ml/trainer-0"]
            assert notice["jobs"][0]["signal"] == "annotation"
            # The grace passes; the budget holds the pod; the notice stays open, says why.
            await wait_until(lambda: any(s == 429 for _, _, s in api.evictions), what="a 429")
            await wait_until(lambda: "disruption budget" in daemon.notices.current(NODE).error)  # type: ignore[union-attr]
            budget.disruptions_allowed = 1
            await wait_until(lambda: ("ml", "trainer-0") not in api.pods, what="evicted")
        assert not api.pod_events("kube-system", "dcgm-exporter")
        assert ("kube-system", "dcgm-exporter") in api.pods
    finally:
        await api.stop()
