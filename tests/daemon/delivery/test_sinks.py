"""The scheduler backend the config's ``type`` builds: what each offers, on one client."""

from __future__ import annotations

from pathlib import Path

from adapters.schedulers.kubernetes.label import KubeNodeLabel
from adapters.schedulers.kubernetes.pods import POD_NOTICE, KubePods
from adapters.schedulers.kubernetes.sink import KubernetesSink
from adapters.schedulers.slurm.rest_jobs import SlurmRestJobs
from adapters.schedulers.slurm.sink import SlurmSink
from adapters.schedulers.slurm.weight import SlurmWeight
from adapters.schedulers.webhook.sink import WebhookSink
from daemon.config.scheduler import (
    KubernetesSchedulerConfig,
    SlurmSchedulerConfig,
    WebhookSchedulerConfig,
)
from daemon.config.steering import SteeringConfig
from daemon.delivery.sinks import build_backend, build_job_notices
from daemon.service.steering import build_setting
from fakes.kube_api import FakeKubeApi
from fakes.slurmrestd import FakeSlurmrestd
from tests.support.secrets import write_secret

STEERING = SteeringConfig(enabled=True)


async def test_a_webhook_offers_delivery_only(tmp_path: Path) -> None:
    secret = write_secret(tmp_path / "hook.key", "s3cret\n")
    cfg = WebhookSchedulerConfig(type="webhook", url="http://127.0.0.1:9/hook", secret_file=secret)
    backend = build_backend(cfg, 600.0)
    try:
        assert backend.name == "webhook" and isinstance(backend.sink(), WebhookSink)
        assert backend.lister() is None and backend.job_control() is None
        assert build_job_notices(cfg, 600.0, backend) is None
        assert build_setting(backend, STEERING) is None
    finally:
        await backend.sink().close()


async def test_slurm_detects_the_api_once_for_the_sink_the_jobs_and_the_weight(
    tmp_path: Path,
) -> None:
    fake = FakeSlurmrestd()
    await fake.start()
    fake.nodes["gpu01"].weight = 1
    slurm_token = write_secret(tmp_path / "jwt", "token-root\n")
    cfg = SlurmSchedulerConfig(
        type="slurm", rest_url=fake.url, token_file=slurm_token, notice_signal="URG"
    )
    backend = build_backend(cfg, 600.0)
    sink = backend.sink()
    try:
        assert isinstance(sink, SlurmSink) and backend.lister() is sink
        built = build_job_notices(cfg, 600.0, backend)
        assert built is not None
        jobs, settings = built
        assert isinstance(jobs, SlurmRestJobs)
        assert (settings.signal, settings.requeue) == ("URG", True)
        steering = build_setting(backend, STEERING)
        assert steering is not None and isinstance(steering[0], SlurmWeight)
        weight, value_of = steering
        assert value_of(STEERING, 0) == str(STEERING.weights[0])
        assert (await sink.read_state(["gpu01"]))["gpu01"].exists
        assert await jobs.running("gpu01") == []
        assert await weight.read("gpu01") == "1"
        # One client: one session, one token, one API version for all three.
        assert [p for _, p in fake.requests if p.startswith("/openapi")] == ["/openapi/v3"]
    finally:
        await sink.close()
        await fake.stop()


async def test_kubernetes_tells_pods_and_labels_nodes_on_the_sinks_client(
    tmp_path: Path,
) -> None:
    api = FakeKubeApi()
    api.add_node("node-a")
    await api.start()
    token = write_secret(tmp_path / "kube.token", "test-token\n")
    cfg = KubernetesSchedulerConfig(
        type="kubernetes", api_url=api.url, token_file=token, evict=False
    )
    backend = build_backend(cfg, 600.0)
    sink = backend.sink()
    try:
        assert isinstance(sink, KubernetesSink) and backend.lister() is sink
        built = build_job_notices(cfg, 600.0, backend)
        assert built is not None
        pods, settings = built
        assert isinstance(pods, KubePods)
        assert (settings.signal, settings.requeue) == (POD_NOTICE, False)
        steering = build_setting(backend, STEERING)
        assert steering is not None and isinstance(steering[0], KubeNodeLabel)
        label, value_of = steering
        assert value_of(STEERING, 2) == "2"
        assert await pods.running("node-a") == []
        await label.write("node-a", "2", None)
        assert await label.read("node-a") == "2"
        assert (await sink.read_state(["node-a"]))["node-a"].exists
    finally:
        await sink.close()
        await api.stop()
