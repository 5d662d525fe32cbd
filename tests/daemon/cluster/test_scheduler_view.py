"""The cluster view from the scheduler: one listing read, turned into the policy's ClusterView."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from adapters.schedulers.base import NodeView
from adapters.schedulers.kubernetes.client import KubeClient, connection
from adapters.schedulers.kubernetes.listing import RACK_LABEL
from adapters.schedulers.kubernetes.sink import KubernetesSink
from adapters.schedulers.slurm.auth import JwtToken
from adapters.schedulers.slurm.client import SlurmClient
from adapters.schedulers.slurm.listing import listed_scontrol, slurm_time
from adapters.schedulers.slurm.sink import SlurmSink, parse_scontrol_node
from daemon.cluster.scheduler_view import SchedulerView
from fakes.kube_api import FakeKubeApi
from fakes.slurmrestd import FakeSlurmrestd
from policies.model import REASON_PREFIX, Action, Decision, FaultDomain, idempotency_key
from policies.safety import reason_domain, reason_excludes, reason_is_ours, scheduler_reason

RACKS = {"gpu01": "a", "gpu02": "a", "gpu03": "b", "gpu04": "b"}


def decision(node: str, action: Action, domain: FaultDomain, words: str = "hot") -> Decision:
    return Decision(
        node, action, f"{REASON_PREFIX} {words}", domain, 0.0, idempotency_key(node, action, 1)
    )


@pytest.mark.parametrize(
    ("reason", "ours", "domain"),
    [
        ("rackguard: gpu3 hot", True, FaultDomain.NONE),  # the old form stays ours
        ("rackguard[cooling_loop]: loop failing", True, FaultDomain.COOLING_LOOP),
        ("rackguard[gpu]: gpu3 hot", True, FaultDomain.GPU),
        ("rackguard[bogus]: x", False, FaultDomain.NONE),  # not a domain: not ours
        ("maint ticket-1", False, FaultDomain.NONE),
        ("rackguardian: x", False, FaultDomain.NONE),
        ("", False, FaultDomain.NONE),
    ],
)
def test_reasons_ours_and_their_domain(reason: str, ours: bool, domain: FaultDomain) -> None:
    assert reason_is_ours(reason) is ours
    assert reason_domain(reason) is domain
    assert NodeView("n", drained=True, reason=reason).foreign is not ours


def test_scheduler_reason_tags_the_domain_and_round_trips() -> None:
    d = decision("gpu01", Action.DRAIN, FaultDomain.COOLING_LOOP, "loop failing")
    assert scheduler_reason(d) == "rackguard[cooling_loop]: loop failing"
    assert reason_domain(scheduler_reason(d)) is FaultDomain.COOLING_LOOP
    assert scheduler_reason(decision("gpu01", Action.RESUME, FaultDomain.GPU)).startswith(
        REASON_PREFIX
    )


@pytest.mark.parametrize(
    ("reason", "excludes"),
    [
        ("rackguard[gpu]: exclude: gpu3 at 91 C", True),
        ("rackguard: exclude: gpu3 at 91 C", True),  # untagged domain, marked action
        ("rackguard[gpu]: gpu3 hot", False),  # the tags written before the mark
        ("rackguard: gpu3 hot", False),
        ("rackguard[bogus]: exclude: x", False),  # not ours
        ("exclude: maint", False),
        ("rackguard[gpu]: gpu3 hot, exclude: soon", False),  # only right after the tag
    ],
)
def test_reasons_mark_an_exclusion(reason: str, excludes: bool) -> None:
    assert reason_excludes(reason) is excludes


def test_an_exclusion_is_marked_after_the_tag_and_the_tag_still_parses() -> None:
    d = decision("gpu01", Action.EXCLUDE, FaultDomain.GPU, "gpu3 at 91 C")
    reason = scheduler_reason(d)
    assert reason == "rackguard[gpu]: exclude: gpu3 at 91 C"
    assert reason_is_ours(reason) and reason_domain(reason) is FaultDomain.GPU
    assert reason_excludes(reason)
    untagged = scheduler_reason(decision("gpu01", Action.EXCLUDE, FaultDomain.NONE))
    assert untagged == "rackguard: exclude: hot" and reason_excludes(untagged)
    assert not reason_excludes(scheduler_reason(decision("gpu01", Action.DRAIN, FaultDomain.GPU)))


def test_a_drain_is_not_satisfied_by_an_exclusions_drain_in_drain_mode() -> None:
    marked = NodeView("n", drained=True, reason="rackguard[gpu]: exclude: hot")
    assert not marked.satisfies(Action.DRAIN, exclude_down=False)  # rewritten as a drain
    assert marked.satisfies(Action.EXCLUDE, exclude_down=False)
    plain = NodeView("n", drained=True, reason="rackguard[gpu]: hot")
    assert plain.satisfies(Action.DRAIN, exclude_down=False)
    assert plain.satisfies(Action.EXCLUDE, exclude_down=False)  # an older release's exclusion


@pytest.fixture
async def slurm(tmp_path: Path) -> AsyncIterator[tuple[FakeSlurmrestd, SlurmSink]]:
    fake = FakeSlurmrestd(list(RACKS), racks=RACKS)
    await fake.start()
    token = tmp_path / "slurm.jwt"
    token.write_text("token-root\n")
    sink = SlurmSink(SlurmClient(fake.url, token=JwtToken(token)))
    yield fake, sink
    await sink.close()
    await fake.stop()


async def test_slurm_listing_gives_out_of_service_racks_trips_and_resumes(
    slurm: tuple[FakeSlurmrestd, SlurmSink],
) -> None:
    fake, sink = slurm
    view = SchedulerView(sink, interval_s=10.0, horizon_s=600.0)
    fake.admin_drain("gpu04", "maint ticket-1")  # foreign: never counted, never touched
    await view.read_once()
    first = view.view(time.monotonic())
    assert first is not None and not first.out and first.cluster_size == 4
    assert first.racks == {"a": ("gpu01", "gpu02"), "b": ("gpu03", "gpu04")}

    await sink.deliver(decision("gpu01", Action.DRAIN, FaultDomain.COOLING_LOOP, "loop failing"))
    follower = decision("gpu02", Action.DRAIN, FaultDomain.COOLING_LOOP, "x (following gpu01)")
    await sink.deliver(follower)
    await view.read_once()
    now = time.monotonic()
    v = view.view(now)
    assert v is not None and set(v.out) == {"gpu01", "gpu02"}
    lead = v.out["gpu01"]
    assert (lead.rack, lead.domain, lead.action, lead.following) == (
        "a",
        FaultDomain.COOLING_LOOP,
        Action.DRAIN,
        "",
    )
    assert v.out["gpu02"].following == "gpu01"  # a follower does not lead others
    assert now - lead.since < 5.0  # from the scheduler's reason time
    assert {t.node for t in v.trips} == {"gpu01", "gpu02"}

    await sink.deliver(decision("gpu01", Action.RESUME, FaultDomain.NONE))
    await view.read_once()
    v = view.view(time.monotonic())
    assert v is not None and set(v.out) == {"gpu02"}
    assert [r.node for r in v.resumes] == ["gpu01"] and v.resumes[0].rack == "a"


async def test_an_unreadable_scheduler_keeps_the_last_view(
    slurm: tuple[FakeSlurmrestd, SlurmSink],
) -> None:
    fake, sink = slurm
    view = SchedulerView(sink, interval_s=10.0, horizon_s=600.0)
    await sink.deliver(decision("gpu03", Action.EXCLUDE, FaultDomain.GPU))
    await view.read_once()
    fake.fail_next = 3
    await view.read_once()
    assert not view.healthy and view.failures == 1
    v = view.view(time.monotonic())
    assert v is not None and v.out["gpu03"].action is Action.EXCLUDE
    await view.read_once()
    await view.read_once()
    await view.read_once()
    assert view.healthy


async def test_kubernetes_listing_takes_the_rack_label(tmp_path: Path) -> None:
    api = FakeKubeApi()
    for name, rack in RACKS.items():
        api.add_node(name)
        api.nodes[name]["metadata"]["labels"][RACK_LABEL] = rack
    await api.start()
    token = tmp_path / "token"
    token.write_text("test-token\n")
    sink = KubernetesSink(KubeClient(connection(api_url=api.url, token_file=token)))
    try:
        await sink.deliver(decision("gpu03", Action.DRAIN, FaultDomain.RACK, "inlet air"))
        listed = await sink.list_nodes()
        by_name = {n.view.node: n for n in listed}
        assert by_name["gpu03"].rack == "b" and by_name["gpu03"].view.drained
        view = SchedulerView(sink, interval_s=10.0, horizon_s=600.0)
        view.absorb(listed, time.monotonic(), time.time())
        v = view.view(time.monotonic())
        assert v is not None and v.out["gpu03"].domain is FaultDomain.RACK
    finally:
        await sink.close()
        await api.stop()


def test_scontrol_lines_give_rack_feature_and_reason_time() -> None:
    line = (
        "NodeName=gpu02 Arch=x86_64 CoresPerSocket=1 AvailableFeatures=rack_a,ib "
        "ActiveFeatures=rack_a,ib State=IDLE+DRAIN "
        "Reason=rackguard[node]: hot [root@2026-11-30T05:08:24]"
    )
    listed = listed_scontrol(line, parse_scontrol_node(line) or NodeView(""))
    assert listed.rack == "a" and listed.view.reason == "rackguard[node]: hot"
    assert listed.reason_at is not None and listed.reason_at > 1.7e9
    assert slurm_time({"set": False, "number": 5}) is None and slurm_time(1700000000) == 1.7e9


async def test_exclusions_carried_out_as_drains_are_seen_as_exclusions_and_critical_trips(
    slurm: tuple[FakeSlurmrestd, SlurmSink],
) -> None:
    fake, sink = slurm  # exclude_state = "drain", the default
    view = SchedulerView(sink, interval_s=10.0, horizon_s=600.0)
    await view.read_once()
    fake.admin_drain("gpu04", "rackguard[gpu]: hot")  # an older release's drain: a drain
    await sink.deliver(decision("gpu01", Action.EXCLUDE, FaultDomain.GPU, "gpu3 at 91 C"))
    await sink.deliver(decision("gpu02", Action.DRAIN, FaultDomain.GPU, "gpu1 heating"))
    await view.read_once()
    assert fake.nodes["gpu01"].base == "IDLE" and fake.nodes["gpu01"].flags == ["DRAIN"]
    v = view.view(time.monotonic())
    assert v is not None
    assert {n: o.action for n, o in v.out.items()} == {
        "gpu01": Action.EXCLUDE,
        "gpu02": Action.DRAIN,
        "gpu04": Action.DRAIN,
    }
    assert {t.node: t.critical for t in v.trips} == {"gpu01": True, "gpu02": False, "gpu04": False}
