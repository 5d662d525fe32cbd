"""Kubernetes pod notices against the fake API server over HTTP, with the real decision store.

Each pod the node runs (not DaemonSet pods, not mirror pods, not finished or
terminating ones) is annotated with its deadline and given an Event, once per
notice, even across a restart; at the deadline it is evicted through the
Eviction API, a disruption budget's 429 asked again until it lets go.

The notice task runs on a wall clock the test moves (``Clock``); its waits are
short real waits, so "not before the deadline" is checked over loop cycles the
test counts, never over elapsed time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest
import yaml

from adapters.schedulers.decision_json import rfc3339
from adapters.schedulers.jobs import JobControlError, NoticeTerms, Outcome, RunningJob
from adapters.schedulers.kubernetes.client import KubeClient, connection
from adapters.schedulers.kubernetes.pods import (
    CHECKPOINT_ANNOTATION,
    EVENT_REASON,
    LIST_RESTARTS,
    NOT_HERE,
    PAGE_SIZE,
    POD_NOTICE,
    WITHDRAWN_REASON,
    KubePods,
)
from adapters.schedulers.kubernetes.sink import KubernetesSink
from daemon.delivery.deliverer import wait_or_wake
from daemon.delivery.notices import JobNotices, Notice, NoticeSettings
from daemon.delivery.outbox import DecisionStore, Status
from daemon.http.bodies import to_wire
from daemon.http.notice import Notice as NoticeBody
from fakes.kube_api import Budget, FakeKubeApi
from policies.model import Action
from tests.support.delivery import decision
from tests.support.paths import ROOT
from tests.support.wait import wait_until

T0 = 1_767_225_600.0
GRACE = NoticeSettings(
    signal=POD_NOTICE,
    checkpoint_grace_s=600.0,
    critical_grace_s=20.0,
    retry_initial_s=1.0,
    retry_max_s=8.0,
)


@dataclass
class Clock:
    """The notice task's wall clock, moved by the test."""

    now: float = T0

    def __call__(self) -> float:
        return self.now


@dataclass
class Running:
    notices: JobNotices
    ticks: list[float]  # every wait the task asked for: its loop cycles

    def notice(self, node: str = "node-a") -> Notice:
        n = self.notices.current(node)
        assert n is not None, f"no open notice on {node}"
        return n

    def closed(self) -> bool:
        """node-a has no open notice (none yet, or it ended)."""
        return self.notices.current("node-a") is None

    def failures(self, node: str = "node-a") -> int:
        n = self.notices.current(node)
        return n.failures if n is not None else 0

    async def cycles(self, count: int = 5) -> None:
        """Let the task go round its loop ``count`` more times."""
        start = len(self.ticks)
        await wait_until(lambda: len(self.ticks) >= start + count, what="notice loop cycles")


Notices = AbstractAsyncContextManager["Running"]


@pytest.fixture
async def api() -> AsyncIterator[FakeKubeApi]:
    fake = FakeKubeApi()
    fake.add_node("node-a")
    fake.add_node("node-b")
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture
def run(api: FakeKubeApi, token_file: Path, tmp_path: Path) -> Callable[[Clock], Notices]:
    """Start a daemon's notice task on this test's database: ``async with run(clock)``."""
    return partial(notices_on, tmp_path / "o.db", api, token_file)


@contextlib.asynccontextmanager
async def notices_on(
    db: Path,
    api: FakeKubeApi,
    token_file: Path,
    clock: Clock,
    settings: NoticeSettings = GRACE,
) -> AsyncIterator[Running]:
    """One daemon's notice task: its own store on ``db`` and its own API session."""
    store = DecisionStore(db)
    pods = KubePods(KubeClient(connection(api_url=api.url, token_file=token_file)))
    ticks: list[float] = []

    async def tick(delay: float, wake: asyncio.Event) -> None:
        ticks.append(delay)
        await wait_or_wake(min(delay, 0.005), wake)

    n = JobNotices(store, pods, settings, wall=clock, sleep=tick)
    tasks = [asyncio.create_task(n.run()), asyncio.create_task(store.run())]
    try:
        await n.loaded.wait()
        yield Running(n, ticks)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await n.close()
        store.close()


def a_node_of_every_kind(api: FakeKubeApi) -> None:
    api.add_pod("ml", "trainer-0", "node-a", labels={"app": "trainer"})
    api.add_pod("ml", "notebook", "node-a")
    api.add_pod("kube-system", "gpu-exporter", "node-a", daemonset=True)
    api.add_pod("kube-system", "etcd-node-a", "node-a", mirror=True)
    api.add_pod("ml", "finished", "node-a", phase="Succeeded")
    api.add_pod("ml", "crashed", "node-a", phase="Failed")
    api.add_pod("ml", "leaving", "node-a")
    api.pods[("ml", "leaving")]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    api.add_pod("ml", "elsewhere", "node-b")


ELIGIBLE = [("ml", "trainer-0"), ("ml", "notebook")]


def annotated(api: FakeKubeApi) -> dict[tuple[str, str], str]:
    return {
        key: pod["metadata"]["annotations"][CHECKPOINT_ANNOTATION]
        for key, pod in api.pods.items()
        if CHECKPOINT_ANNOTATION in pod["metadata"].get("annotations", {})
    }


def told(r: Running, node: str = "node-a") -> bool:
    n = r.notices.current(node)
    return n is not None and n.told_at is not None


async def applied(r: Running, action: Action, timeout: float = 10.0) -> None:  # noqa: ASYNC109
    """The deliverer confirmed ``action`` on node-a: wait until its pods are told."""
    r.notices.settled(decision("node-a", action), Status.CONFIRMED, "read back")
    await wait_until(lambda: told(r), timeout=timeout, what="the pods told")


async def test_each_eligible_pod_gets_the_annotation_and_an_event_and_no_other_pod_does(
    api: FakeKubeApi,
    run: Callable[[Clock], Notices],
) -> None:
    a_node_of_every_kind(api)
    clock = Clock()
    async with run(clock) as r:
        await applied(r, Action.DRAIN)
        notice = r.notice()
    deadline = rfc3339(T0 + 600.0)
    assert annotated(api) == dict.fromkeys(ELIGIBLE, deadline)
    assert sorted(p for p, _, _ in api.pod_patches) == ["ml/notebook", "ml/trainer-0"]
    for ns, name in ELIGIBLE:
        (event,) = api.pod_events(ns, name)
        assert event["reason"] == EVENT_REASON and event["type"] == "Warning"
        assert event["involvedObject"] == {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": ns,
            "name": name,
            "uid": f"uid-{ns}-{name}",  # as kubectl describe matches it
        }
        assert event["metadata"]["namespace"] == ns
        message = event["message"]
        assert deadline in message and "test drain #1" in message and "gpu" in message
    assert len(api.events) == 2  # none on the DaemonSet, mirror, finished or leaving pods
    assert {j.job_id: (j.signal, j.signaled) for j in notice.jobs.values()} == {
        "ml/trainer-0": (POD_NOTICE, "done"),
        "ml/notebook": (POD_NOTICE, "done"),
    }
    assert not api.evictions


async def test_pods_still_there_at_the_deadline_are_evicted_and_no_sooner(
    api: FakeKubeApi,
    run: Callable[[Clock], Notices],
) -> None:
    a_node_of_every_kind(api)
    clock = Clock()
    async with run(clock) as r:
        await applied(r, Action.DRAIN)
        clock.now = T0 + 599.0
        await r.cycles()
        assert not api.evictions  # a second before the deadline
        clock.now = T0 + 600.0
        await wait_until(r.closed, what="evicted")
        (notice,) = r.notices.all()
    assert sorted((ns, n, s) for ns, n, s in api.evictions) == [
        ("ml", "notebook", 201),
        ("ml", "trainer-0", 201),
    ]
    assert notice.closed == "requeued"
    assert {j.requeued for j in notice.jobs.values()} == {"done"}
    left = {k for k, p in api.pods.items() if p["spec"]["nodeName"] == "node-a"}
    assert ("kube-system", "gpu-exporter") in left and ("kube-system", "etcd-node-a") in left


async def test_a_disruption_budget_is_asked_again_with_backoff_until_it_lets_go(
    api: FakeKubeApi,
    run: Callable[[Clock], Notices],
) -> None:
    a_node_of_every_kind(api)
    budget = Budget(("app", "trainer"), disruptions_allowed=0)
    api.budgets.append(budget)
    clock = Clock()
    async with run(clock) as r:
        await applied(r, Action.DRAIN)
        clock.now = T0 + 600.0
        delays = []
        for _ in range(4):  # each refusal waits longer than the last, up to retry_max_s
            await wait_until(lambda: r.notice().retry_at > clock.now, what="a 429, backed off")
            delays.append(r.notice().retry_at - clock.now)
            clock.now = r.notice().retry_at
        assert delays == [1.0, 2.0, 4.0, 8.0]
        assert sum(s == 429 for _, n, s in api.evictions if n == "trainer-0") >= 4
        assert "disruption budget" in r.notice().error
        assert r.notice().jobs["ml/trainer-0"].requeued.startswith("blocked: HTTP 429")
        budget.disruptions_allowed = 1  # the trainer's other replica is ready elsewhere
        clock.now += 8.0
        await wait_until(r.closed, what="evicted at last")
        (notice,) = r.notices.all()
    assert notice.closed == "requeued" and notice.jobs["ml/trainer-0"].requeued == "done"
    # The notebook went at the first pass and was not asked about again.
    assert [s for _, n, s in api.evictions if n == "notebook"] == [201]
    assert ("ml", "trainer-0") not in api.pods


async def test_a_restart_between_notice_and_eviction_neither_tells_again_nor_forgets(
    api: FakeKubeApi, token_file: Path, tmp_path: Path
) -> None:
    a_node_of_every_kind(api)
    db = tmp_path / "o.db"
    clock = Clock()
    async with notices_on(db, api, token_file, clock) as r:
        await applied(r, Action.DRAIN)
    patches, events = len(api.pod_patches), len(api.events)
    assert patches == 2 and events == 2 and not api.evictions
    # The next process, on the same database, with the deadline passed meanwhile.
    clock.now = T0 + 3600.0
    async with notices_on(db, api, token_file, clock) as r:
        await wait_until(r.closed, what="evicted after restart")
    assert (len(api.pod_patches), len(api.events)) == (patches, events)  # not told again
    assert sorted(n for _, n, s in api.evictions if s == 201) == ["notebook", "trainer-0"]


async def test_an_exclusion_waits_for_the_critical_grace_before_evicting(
    api: FakeKubeApi,
    run: Callable[[Clock], Notices],
) -> None:
    a_node_of_every_kind(api)
    clock = Clock()
    async with run(clock) as r:
        await applied(r, Action.EXCLUDE)
        assert annotated(api) == dict.fromkeys(ELIGIBLE, rfc3339(T0 + 20.0))
        clock.now = T0 + 19.0
        await r.cycles()
        assert not api.evictions
        clock.now = T0 + 20.0
        await wait_until(r.closed, what="evicted")
    assert sorted(n for _, n, s in api.evictions if s == 201) == ["notebook", "trainer-0"]


async def test_an_api_server_down_at_the_notice_delays_it_and_loses_nothing(
    api: FakeKubeApi,
    caplog: pytest.LogCaptureFixture,
    run: Callable[[Clock], Notices],
) -> None:
    caplog.set_level("INFO")
    a_node_of_every_kind(api)
    port = int(api.url.rsplit(":", 1)[1])
    clock = Clock()
    async with run(clock) as r:
        await api.stop()
        r.notices.settled(decision("node-a", Action.DRAIN), Status.CONFIRMED, "read back")
        await wait_until(lambda: r.failures() >= 1, what="a failed attempt")
        assert "list pods on node-a" in r.notice().error
        clock.now = r.notice().retry_at
        await wait_until(lambda: r.failures() >= 2, what="asked again")
        await api.start(port)
        clock.now = r.notice().retry_at
        await wait_until(lambda: told(r), what="told once the server is back")
        await wait_until(lambda: r.notice().error == "", what="the error cleared")
    assert annotated(api) == dict.fromkeys(ELIGIBLE, rfc3339(T0 + 600.0))
    assert len(api.pod_patches) == 2 and len(api.events) == 2
    assert "reachable again" in caplog.text


async def test_a_pod_refused_its_notice_for_good_is_shown_and_still_evicted_at_the_deadline(
    api: FakeKubeApi,
    caplog: pytest.LogCaptureFixture,
    run: Callable[[Clock], Notices],
) -> None:
    api.add_pod("ml", "trainer-0", "node-a")
    api.forbid = {"patch pods"}  # listed, then refused: the pod is not told
    clock = Clock()
    async with run(clock) as r:
        r.notices.settled(decision("node-a", Action.DRAIN), Status.CONFIRMED, "read back")
        await wait_until(lambda: told(r), what="the pass over the pods")
        job = r.notice().jobs["ml/trainer-0"]
        assert job.signal_started_at is None and job.signaled.startswith("failed: ")
        assert "HTTP 403" in job.signaled
        await r.cycles()
        # Final: logged once at ERROR, not asked again every cycle.
        assert [rec.levelno for rec in caplog.records].count(logging.ERROR) == 1
        clock.now = T0 + 600.0
        await wait_until(r.closed, what="evicted at the deadline, told or not")
    assert [s for _, _, s in api.evictions] == [201]
    assert not annotated(api)


async def test_a_forbidden_eviction_is_a_final_failure_logged_once_and_shown(
    api: FakeKubeApi,
    caplog: pytest.LogCaptureFixture,
    run: Callable[[Clock], Notices],
) -> None:
    api.add_pod("ml", "trainer-0", "node-a")
    api.forbid = {"create pods/eviction"}
    clock = Clock()
    async with run(clock) as r:
        await applied(r, Action.DRAIN)
        clock.now = T0 + 600.0
        await wait_until(r.closed, what="closed with the failure stated")
        (n,) = r.notices.all()
        await r.cycles()
    job = n.jobs["ml/trainer-0"]
    assert job.requeued.startswith("failed: ") and "HTTP 403" in job.requeued
    assert '"pods/eviction"' in job.requeued
    assert "could not be moved: ml/trainer-0" in n.closed
    # On /v1/notices:
    assert to_wire(NoticeBody.of(n))["jobs"][0]["requeued"] == job.requeued
    errors = [rec for rec in caplog.records if rec.levelno == logging.ERROR]
    assert len(errors) == 1 and "403" in errors[0].getMessage()
    assert [s for _, _, s in api.evictions] == [403]  # not a silent retry loop


async def test_a_pod_name_with_odd_characters_is_told_and_evicted_by_its_own_name(
    api: FakeKubeApi,
    run: Callable[[Clock], Notices],
) -> None:
    odd = "train.v2-x?y#z%41 é"  # no real pod is named so: the path must be quoted all the same
    api.add_pod("ml", odd, "node-a")
    api.add_pod("ml", "train.v2-x", "node-a")  # what a careless client would hit instead
    clock = Clock()
    async with run(clock) as r:
        await applied(r, Action.DRAIN)
        assert set(annotated(api)) == {("ml", odd), ("ml", "train.v2-x")}
        assert len(api.pod_events("ml", odd)) == 1
        clock.now = T0 + 600.0
        await wait_until(r.closed)
    assert sorted(n for _, n, s in api.evictions if s == 201) == sorted([odd, "train.v2-x"])


async def test_hundreds_of_pods_are_each_told_once_and_evicted(
    api: FakeKubeApi,
    run: Callable[[Clock], Notices],
) -> None:
    for i in range(300):
        api.add_pod(f"ns-{i % 7}", f"worker-{i}", "node-a")
    for i in range(50):
        api.add_pod("ml", f"other-{i}", "node-b")
    clock = Clock()
    async with run(clock) as r:
        await applied(r, Action.DRAIN, timeout=120)
        clock.now = T0 + 600.0
        await wait_until(r.closed, timeout=120)
        (notice,) = r.notices.all()
    assert len(notice.jobs) == 300 and len(api.pod_patches) == 300 and len(api.events) == 300
    assert sum(s == 201 for _, _, s in api.evictions) == 300
    assert all(p["spec"]["nodeName"] == "node-b" for p in api.pods.values())


async def test_pods_of_the_adapter_alone_gone_and_forbidden(
    api: FakeKubeApi, token_file: Path
) -> None:
    pods = KubePods(KubeClient(connection(api_url=api.url, token_file=token_file)))
    try:
        gone = RunningJob("ml/vanished", "vanished", "ml", node="node-a", uid="uid-vanished")
        assert (await pods.requeue(gone))[0] is Outcome.GONE  # 404: already gone, done
        api.add_pod("ml", "p", "node-a")
        api.forbid = {"create events"}
        terms = NoticeTerms(POD_NOTICE, T0, "rackguard[gpu]: hot", "gpu")
        (listed,) = await pods.running("node-a")
        outcome, said = await pods.notify(listed, terms)
        # The annotation is the notice; a refused Event is said, not fatal.
        assert outcome is Outcome.DONE and "Event not recorded (HTTP 403)" in said
        assert annotated(api) == {("ml", "p"): rfc3339(T0)}
    finally:
        await pods.close()


async def test_the_shipped_cluster_role_grants_what_the_sink_and_notices_use_and_no_more(
    api: FakeKubeApi,
    token_file: Path,
    run: Callable[[Clock], Notices],
) -> None:
    a_node_of_every_kind(api)
    sink = KubernetesSink(KubeClient(connection(api_url=api.url, token_file=token_file)))
    clock = Clock()
    try:
        async with run(clock) as r:
            await sink.deliver(decision("node-a", Action.DRAIN))
            await sink.read_state(["node-a"])
            await sink.list_nodes()
            sink.follow(True)  # the cluster's view reader: list, then watch
            await sink.list_nodes()
            await wait_until(lambda: ("", "watch", "nodes") in api.used, what="watch")
            await applied(r, Action.DRAIN)
            clock.now = T0 + 600.0
            await wait_until(r.closed)
            await sink.deliver(decision("node-a", Action.RESUME, 2))
    finally:
        await sink.close()
    docs = yaml.safe_load_all((ROOT / "daemon/deploy/kubernetes/rackguard.yaml").read_text())
    (role,) = [d for d in docs if d["kind"] == "ClusterRole"]
    granted = {
        (group, verb, resource)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    # Core v1, and get on apps/v1 DaemonSets (kubectl drain's check).
    assert {g for g, _, _ in granted} == {"", "apps"}
    assert granted == api.used


async def test_an_exclusion_during_a_drain_tells_the_pods_the_earlier_deadline(
    api: FakeKubeApi,
    run: Callable[[Clock], Notices],
) -> None:
    a_node_of_every_kind(api)
    clock = Clock()
    async with run(clock) as r:
        await applied(r, Action.DRAIN)
        assert annotated(api) == dict.fromkeys(ELIGIBLE, rfc3339(T0 + 600.0))
        clock.now = T0 + 100.0
        r.notices.settled(decision("node-a", Action.EXCLUDE, 2), Status.CONFIRMED, "read back")
        await wait_until(lambda: annotated(api) == dict.fromkeys(ELIGIBLE, rfc3339(T0 + 120.0)))
        await wait_until(lambda: told(r), what="told the new deadline")
        assert not api.evictions
        clock.now = T0 + 120.0
        await wait_until(r.closed, what="evicted")
    for ns, name in ELIGIBLE:
        first, second = api.pod_events(ns, name)
        assert rfc3339(T0 + 600.0) in first["message"]
        assert rfc3339(T0 + 120.0) in second["message"]


async def test_a_resume_before_the_deadline_takes_the_annotation_back(
    api: FakeKubeApi,
    run: Callable[[Clock], Notices],
) -> None:
    a_node_of_every_kind(api)
    api.pods[("ml", "notebook")]["metadata"]["annotations"]["team"] = "vision"
    clock = Clock()
    async with run(clock) as r:
        await applied(r, Action.DRAIN)
        r.notices.settled(decision("node-a", Action.RESUME, 2), Status.CONFIRMED, "read back")
        await wait_until(lambda: not annotated(api), what="annotations removed")
        await wait_until(r.closed)
    assert api.pods[("ml", "notebook")]["metadata"]["annotations"] == {"team": "vision"}
    for ns, name in ELIGIBLE:
        _, withdrawn = api.pod_events(ns, name)
        assert withdrawn["reason"] == WITHDRAWN_REASON and withdrawn["type"] == "Normal"
    assert not api.evictions


async def test_a_crash_while_telling_completes_the_pod_only_where_it_did_not_land(
    api: FakeKubeApi, token_file: Path, tmp_path: Path
) -> None:
    a_node_of_every_kind(api)
    db = tmp_path / "o.db"
    clock = Clock()
    async with notices_on(db, api, token_file, clock) as r:
        await applied(r, Action.DRAIN)
    # As a kill -9 in the middle of telling leaves it: both pods "being told", the
    # notice not finished; the annotation of one never reached the server.
    conn = sqlite3.connect(db)
    conn.execute("UPDATE notice_jobs SET signaled = ''")
    conn.execute("UPDATE notices SET told_at = NULL")
    conn.commit()
    conn.close()
    del api.pods[("ml", "notebook")]["metadata"]["annotations"][CHECKPOINT_ANNOTATION]
    events = len(api.events)
    async with notices_on(db, api, token_file, clock) as r:
        await wait_until(lambda: told(r), what="the notice finished")
    assert annotated(api) == dict.fromkeys(ELIGIBLE, rfc3339(T0 + 600.0))
    # The trainer's annotation was there: no second Event; the notebook's was not.
    assert len(api.pod_events("ml", "trainer-0")) == 1
    assert len(api.pod_events("ml", "notebook")) == 2 and len(api.events) == events + 1
    assert {j.signaled for j in r.notices.all()[0].jobs.values()} == {"done"}


async def test_a_bare_pod_is_told_and_left_running_not_evicted_for_good(
    api: FakeKubeApi,
    caplog: pytest.LogCaptureFixture,
    run: Callable[[Clock], Notices],
) -> None:
    api.add_pod("ml", "scratch", "node-a", bare=True)  # `kubectl run`: no controller
    api.add_pod("ml", "trainer-0", "node-a")
    clock = Clock()
    async with run(clock) as r:
        await applied(r, Action.DRAIN)
        clock.now = T0 + 600.0
        await wait_until(r.closed)
        (notice,) = r.notices.all()
    assert ("ml", "scratch") in annotated(api) and ("ml", "scratch") in api.pods
    assert [n for _, n, _ in api.evictions] == ["trainer-0"]
    assert notice.jobs["ml/scratch"].requeued.startswith("refused: no controller")
    assert "job ml/scratch (ml) cannot be requeued, left running" in caplog.text


async def test_hostile_jobs_a_pod_list_over_the_page_size_is_read_whole(
    api: FakeKubeApi, run: Callable[[Clock], Notices]
) -> None:
    for i in range(PAGE_SIZE * 2 + 7):
        api.add_pod("ml", f"w-{i}", "node-a")
    api.expire_continue = 1  # one page expires mid-list (etcd compacted): listed again
    clock = Clock()
    async with run(clock) as r:
        await applied(r, Action.DRAIN, timeout=120)
        assert len(r.notice().jobs) == PAGE_SIZE * 2 + 7


async def test_hostile_jobs_a_list_that_keeps_expiring_is_an_error_not_a_partial_list(
    api: FakeKubeApi, token_file: Path
) -> None:
    for i in range(PAGE_SIZE + 1):
        api.add_pod("ml", f"w-{i}", "node-a")
    api.expire_continue = LIST_RESTARTS
    pods = KubePods(KubeClient(connection(api_url=api.url, token_file=token_file)))
    try:
        with pytest.raises(JobControlError, match="kept expiring") as err:
            await pods.running("node-a")
    finally:
        await pods.close()
    assert err.value.reason == "incomplete"


async def test_hostile_jobs_only_pods_whose_own_spec_names_the_node(
    api: FakeKubeApi, token_file: Path
) -> None:
    # A server (or a proxy) that ignores the field selector lists every pod.
    api.add_pod("ml", "mine", "node-a")
    api.add_pod("ml", "theirs", "node-b")
    pods = KubePods(KubeClient(connection(api_url=api.url, token_file=token_file)))
    try:
        listed = await pods.running("node-a")
        api.add_pod("ml", "unnamed", "node-a")
        api.pods[("ml", "unnamed")]["metadata"]["uid"] = ""
        with pytest.raises(JobControlError, match="without a namespace, name or uid"):
            await pods.running("node-a")
        api.pods[("ml", "unnamed")]["metadata"]["uid"] = "u"
        api.pods[("ml", "unnamed")]["metadata"]["name"] = ".."
        with pytest.raises(JobControlError, match="address another object"):
            await pods.running("node-a")
        api.pods[("ml", "unnamed")]["metadata"]["ownerReferences"] = "not a list"
        api.pods[("ml", "unnamed")]["metadata"]["name"] = "unnamed"
        with pytest.raises(JobControlError, match="malformed"):
            await pods.running("node-a")
    finally:
        await pods.close()
    assert [(j.job_id, j.node, j.uid) for j in listed] == [("ml/mine", "node-a", "uid-ml-mine")]


async def test_hostile_jobs_hostile_labels_annotations_and_owners_change_nothing(
    api: FakeKubeApi, run: Callable[[Clock], Notices]
) -> None:
    api.add_pod("ml", "trainer", "node-a", labels={"app": "a|b\nnode-b", "x": "$(id)"})
    meta = api.pods[("ml", "trainer")]["metadata"]
    meta["annotations"] = {
        CHECKPOINT_ANNOTATION: "node-b",
        "kubernetes.io/config.source": "file",
        "note": "\u202e" + "|" * 65536,
    }
    # An owner that names a pod of another node as its controller's kind and name.
    meta["ownerReferences"].append({"apiVersion": "v1", "kind": "Pod", "name": "ml/elsewhere"})
    api.add_pod("ml", "elsewhere", "node-b")
    clock = Clock()
    async with run(clock) as r:
        await applied(r, Action.DRAIN)
        clock.now = T0 + 600.0
        await wait_until(r.closed, what="evicted")
        (notice,) = r.notices.all()
    assert set(notice.jobs) == {"ml/trainer"}
    assert [(ns, name) for ns, name, _ in api.evictions] == [("ml", "trainer")]
    assert ("ml", "elsewhere") in api.pods and not api.pods[("ml", "elsewhere")]["metadata"][
        "annotations"
    ]


async def test_hostile_jobs_a_pod_replaced_between_list_and_eviction_is_not_evicted(
    api: FakeKubeApi, run: Callable[[Clock], Notices]
) -> None:
    # A StatefulSet's pod keeps its name: recreated on node-b just before the eviction.
    api.add_pod("ml", "db-0", "node-a")
    api.before_next_evict = lambda ns, name: api.replace_pod(ns, name, "node-b")
    clock = Clock()
    async with run(clock) as r:
        await applied(r, Action.DRAIN)
        clock.now = T0 + 600.0
        await wait_until(r.closed, what="closed")
        (notice,) = r.notices.all()
    assert api.evictions == [("ml", "db-0", 409)]  # the uid precondition held
    assert api.pods[("ml", "db-0")]["spec"]["nodeName"] == "node-b"  # left alone
    assert notice.jobs["ml/db-0"].requeued.startswith("gone")


async def test_hostile_jobs_a_pod_replaced_before_the_tell_is_not_annotated(
    api: FakeKubeApi, token_file: Path
) -> None:
    api.add_pod("ml", "db-0", "node-a")
    pods = KubePods(KubeClient(connection(api_url=api.url, token_file=token_file)))
    terms = NoticeTerms(POD_NOTICE, T0, "rackguard[gpu]: hot", "gpu")
    try:
        (listed,) = await pods.running("node-a")
        api.replace_pod("ml", "db-0", "node-b")  # same name, another node and uid
        elsewhere = await pods.notify(listed, terms)
        api.replace_pod("ml", "db-0", "node-a")  # same name and node, another uid
        replaced = await pods.notify(listed, terms)
        taken_back = await pods.revise(listed, None)
    finally:
        await pods.close()
    assert elsewhere == (Outcome.GONE, NOT_HERE) and replaced == (Outcome.GONE, NOT_HERE)
    assert taken_back[0] is Outcome.DONE  # nothing of ours on it: nothing removed
    assert annotated(api) == {} and api.events == []
