"""Issue 37, items 1-6: each pod is its own unit of work; the pod acted on is the pod told.

Against the fake API server, answering as strictly as a real one where it
matters (the 256 KiB annotation limit, two disruption budgets, admission
webhooks, uid preconditions), with the real decision store.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from adapters.schedulers.decision_json import rfc3339
from adapters.schedulers.jobs import Outcome
from adapters.schedulers.kubernetes.client import KubeClient, connection
from adapters.schedulers.kubernetes.pods import KubePods
from daemon.delivery.outbox import Status
from daemon.http.bodies import to_wire
from daemon.http.notice import Notice as NoticeBody
from fakes.kube_api import ANNOTATIONS_LIMIT, Budget, FakeKubeApi
from policies.model import Action
from tests.adapters.schedulers.kubernetes.test_kube_pods import (
    T0,
    Clock,
    Notices,
    annotated,
    api,
    applied,
    notices_on,
    run,
)
from tests.support.delivery import decision
from tests.support.wait import wait_until

__all__ = ["api", "run"]  # the fixtures, shared with test_kube_pods

DEADLINE = T0 + 600.0


def three_pods(api: FakeKubeApi, odd: str = "odd") -> None:
    """Three pods of node-a, the odd one listed in the middle."""
    api.add_pod("ml", "first", "node-a")
    api.add_pod(odd, "middle", "node-a", labels={"app": "middle"})
    api.add_pod("ml", "last", "node-a")


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


async def test_pod_isolation_a_pod_over_the_annotation_limit_never_blocks_the_others(
    api: FakeKubeApi, caplog: pytest.LogCaptureFixture, run: Callable[[Clock], Notices]
) -> None:
    three_pods(api)
    # Near the 256 KiB total: the checkpoint annotation would carry it over.
    api.pods[("odd", "middle")]["metadata"]["annotations"]["blob"] = "x" * (ANNOTATIONS_LIMIT - 8)
    clock = Clock()
    async with run(clock) as r:
        await applied(r, Action.DRAIN)
        n = r.notice()
        middle = n.jobs["odd/middle"]
        assert middle.signaled.startswith("failed: ") and "HTTP 422" in middle.signaled
        assert "Too long" in middle.signaled
        assert annotated(api) == dict.fromkeys([("ml", "first"), ("ml", "last")], rfc3339(DEADLINE))
        await r.cycles()
        assert len(errors(caplog)) == 1  # once, not every cycle
        clock.now = DEADLINE
        await wait_until(r.closed, what="every pod evicted")
        (n,) = r.notices.all()
    # The one that could not be told is moved all the same: the node is hot.
    assert sorted(name for _, name, s in api.evictions if s == 201) == ["first", "last", "middle"]
    assert n.closed == "requeued"
    assert r.notices.counts.retries["invalid"] == 1


async def test_pod_isolation_an_admission_webhook_denying_one_namespace_blocks_no_other(
    api: FakeKubeApi, caplog: pytest.LogCaptureFixture, run: Callable[[Clock], Notices]
) -> None:
    three_pods(api, odd="locked")
    api.deny_namespaces["locked"] = "changes frozen for the audit"
    clock = Clock()
    async with run(clock) as r:
        await applied(r, Action.DRAIN)
        assert set(annotated(api)) == {("ml", "first"), ("ml", "last")}
        clock.now = DEADLINE
        await wait_until(r.closed, what="closed, the locked pod's failure stated")
        (n,) = r.notices.all()
    assert sorted(name for _, name, s in api.evictions if s == 201) == ["first", "last"]
    assert [s for ns, _, s in api.evictions if ns == "locked"] == [403]  # asked once, final
    locked = n.jobs["locked/middle"]
    assert 'admission webhook "policy.locked.example.com" denied' in locked.signaled
    assert locked.requeued.startswith("failed: ") and "changes frozen" in locked.requeued
    assert "could not be moved: locked/middle" in n.closed
    body = to_wire(NoticeBody.of(n))
    assert {j["job_id"]: j["requeued"] for j in body["jobs"]}["locked/middle"] == locked.requeued
    assert r.notices.counts.retries["admission"] == 2  # the tell and the eviction
    assert r.notices.counts.requeues["failed"] == 1
    assert len(errors(caplog)) == 2 and all("locked/middle" in e for e in errors(caplog))


async def test_pod_isolation_a_pod_under_two_disruption_budgets_fails_once_and_the_rest_go(
    api: FakeKubeApi, caplog: pytest.LogCaptureFixture, run: Callable[[Clock], Notices]
) -> None:
    three_pods(api)
    api.budgets += [Budget(("app", "middle"), 5), Budget(("app", "middle"), 5)]
    clock = Clock()
    async with run(clock) as r:
        await applied(r, Action.DRAIN)
        clock.now = DEADLINE
        await wait_until(r.closed, what="closed")
        (n,) = r.notices.all()
        await r.cycles()
    assert [s for _, name, s in api.evictions if name == "middle"] == [500]  # not 40 times
    assert sorted(name for _, name, s in api.evictions if s == 201) == ["first", "last"]
    assert "more than one PodDisruptionBudget" in n.jobs["odd/middle"].requeued
    assert "could not be moved: odd/middle" in n.closed
    assert r.notices.counts.retries["budgets"] == 1
    assert len(errors(caplog)) == 1 and "more than one PodDisruptionBudget" in errors(caplog)[0]


async def test_pod_isolation_only_the_controller_reference_to_an_existing_daemonset_skips(
    api: FakeKubeApi, run: Callable[[Clock], Notices]
) -> None:
    api.add_pod("kube-system", "exporter", "node-a", daemonset=True)  # a real DaemonSet pod
    # A DaemonSet owner that is not the controller: a ReplicaSet's pod.
    api.add_pod("ml", "not-controller", "node-a")
    owners = api.pods[("ml", "not-controller")]["metadata"]["ownerReferences"]
    owners.append({"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ds", "uid": "uid-ds"})
    # A controller of kind DaemonSet in another API group (a custom resource).
    api.add_pod("ml", "other-group", "node-a")
    api.pods[("ml", "other-group")]["metadata"]["ownerReferences"] = [
        {"apiVersion": "example.com/v1", "kind": "DaemonSet", "name": "x", "controller": True}
    ]
    # A controller reference naming an apps/v1 DaemonSet that does not exist: an orphan.
    api.add_pod("ml", "orphan", "node-a")
    api.pods[("ml", "orphan")]["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "gone", "controller": True}
    ]
    clock = Clock()
    async with run(clock) as r:
        await applied(r, Action.DRAIN)
        clock.now = DEADLINE
        await wait_until(r.closed, what="closed")
        (n,) = r.notices.all()
    assert set(n.jobs) == {"ml/not-controller", "ml/other-group", "ml/orphan"}
    assert set(annotated(api)) == {("ml", "orphan")}  # the rest were evicted
    assert sorted(name for _, name, s in api.evictions if s == 201) == [
        "not-controller",
        "other-group",
    ]
    # Nothing would start the orphan again: told, left running, said (kubectl wants --force).
    assert n.jobs["ml/orphan"].requeued.startswith("refused: no controller")
    assert ("kube-system", "exporter") in api.pods
    assert ("apps", "get", "daemonsets") in api.used


async def test_pod_isolation_a_refused_withdrawal_keeps_no_other_pods_annotation(
    api: FakeKubeApi, run: Callable[[Clock], Notices]
) -> None:
    three_pods(api, odd="locked")
    clock = Clock()
    async with run(clock) as r:
        await applied(r, Action.DRAIN)
        assert len(annotated(api)) == 3
        api.deny_namespaces["locked"] = "frozen"  # after the tell
        r.notices.settled(decision("node-a", Action.RESUME, 2), Status.CONFIRMED, "read back")
        await wait_until(r.closed, what="resumed")
        await wait_until(lambda: len(annotated(api)) == 1, what="the others taken back")
    assert set(annotated(api)) == {("locked", "middle")}
    assert r.notices.counts.retries["admission"] == 1
    assert not api.evictions


async def test_pod_isolation_a_pod_moved_to_another_node_under_its_name_is_not_evicted_there(
    api: FakeKubeApi, run: Callable[[Clock], Notices]
) -> None:
    three_pods(api)
    clock = Clock()
    async with run(clock) as r:
        await applied(r, Action.DRAIN)
        api.before_next_evict = lambda ns, name: api.replace_pod(ns, name, "node-b")
        clock.now = DEADLINE
        await wait_until(r.closed, what="closed")
    # The first pod listed was recreated on node-b between list and eviction: 409, left.
    assert [(name, s) for _, name, s in api.evictions] == [
        ("first", 409),
        ("middle", 201),
        ("last", 201),
    ]
    assert api.pods[("ml", "first")]["spec"]["nodeName"] == "node-b"


async def test_pod_isolation_a_pod_that_lands_after_the_tell_is_told_first_with_its_own_deadline(
    api: FakeKubeApi, token_file: Path, tmp_path: Path
) -> None:
    db = tmp_path / "o.db"
    api.add_pod("ml", "early", "node-a")
    clock = Clock()
    async with notices_on(db, api, token_file, clock) as r:
        await applied(r, Action.DRAIN)
        api.add_pod("ml", "late", "node-a")
        clock.now = DEADLINE
        await wait_until(lambda: ("ml", "late") in annotated(api), what="the late pod told")
        assert [name for _, name, _ in api.evictions] == ["early"]  # not the late one
        late = r.notice().jobs["ml/late"]
        assert late.deadline == DEADLINE + 600.0  # a drain's grace, from its own tell
        assert annotated(api)[("ml", "late")] == rfc3339(DEADLINE + 600.0)
    # A restart keeps its deadline (stored with the job).
    async with notices_on(db, api, token_file, clock) as r:
        await r.cycles()
        assert [name for _, name, _ in api.evictions] == ["early"]
        clock.now = DEADLINE + 600.0
        await wait_until(r.closed, what="the late pod evicted at its own deadline")
    assert [name for _, name, s in api.evictions if s == 201] == ["early", "late"]


async def test_pod_isolation_a_late_pod_on_an_excluded_node_gets_the_critical_grace(
    api: FakeKubeApi, run: Callable[[Clock], Notices]
) -> None:
    api.add_pod("ml", "early", "node-a")
    clock = Clock()
    async with run(clock) as r:
        await applied(r, Action.EXCLUDE)
        api.add_pod("ml", "late", "node-a")
        clock.now = T0 + 20.0
        await wait_until(lambda: ("ml", "late") in annotated(api), what="the late pod told")
        assert r.notice().jobs["ml/late"].deadline == T0 + 40.0
        clock.now = T0 + 39.0
        await r.cycles()
        assert [name for _, name, _ in api.evictions] == ["early"]
        clock.now = T0 + 40.0
        await wait_until(r.closed, what="evicted")
    assert [name for _, name, s in api.evictions if s == 201] == ["early", "late"]


async def test_pod_isolation_a_blocked_pod_retries_on_its_own_schedule_shown_on_that_pod(
    api: FakeKubeApi, run: Callable[[Clock], Notices]
) -> None:
    three_pods(api)
    budget = Budget(("app", "middle"), disruptions_allowed=0)
    api.budgets.append(budget)
    clock = Clock()
    async with run(clock) as r:
        await applied(r, Action.DRAIN)
        clock.now = DEADLINE
        await wait_until(lambda: r.notice().error != "", what="the pass, with a 429")
        body = to_wire(NoticeBody.of(r.notice()))
        jobs = {j["job_id"]: j for j in body["jobs"]}
        assert "disruption budget" in jobs["odd/middle"]["error"]
        assert jobs["odd/middle"]["retry_at"] == DEADLINE + 1.0
        assert jobs["ml/first"]["error"] == "" and jobs["ml/first"]["retry_at"] is None
        assert body["error"].startswith("odd/middle: ")
        # The others went at once; the blocked one is asked again only at its retry_at.
        assert sorted(name for _, name, s in api.evictions if s == 201) == ["first", "last"]
        await r.cycles()
        assert [s for _, name, s in api.evictions if name == "middle"] == [429]
        budget.disruptions_allowed = 1
        clock.now = DEADLINE + 1.0
        await wait_until(r.closed, what="evicted at last")
        (n,) = r.notices.all()
    assert n.closed == "requeued" and n.error == ""
    assert [s for _, name, s in api.evictions if name == "middle"] == [429, 201]


async def test_pod_isolation_a_daemonset_recreated_or_unreadable_is_handled_as_drain_would(
    api: FakeKubeApi, token_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    api.add_pod("kube-system", "exporter", "node-a", daemonset=True)
    pods = KubePods(KubeClient(connection(api_url=api.url, token_file=token_file)))
    try:
        assert await pods.running("node-a") == []
        # The DaemonSet deleted and recreated under its name: this pod is an orphan.
        api.daemonsets[("kube-system", "ds")]["metadata"]["uid"] = "uid-ds-2"
        (orphan,) = await pods.running("node-a")
        outcome, said = await pods.requeue(orphan)
        assert outcome is Outcome.REFUSED and "no controller" in said
        # An old ClusterRole without get on daemonsets: taken at its word, said once.
        api.forbid = {"get daemonsets"}
        assert await pods.running("node-a") == []
        assert await pods.running("node-a") == []
        warned = [r for r in caplog.records if "daemonsets.apps" in r.getMessage()]
        assert len(warned) == 1
    finally:
        await pods.close()
