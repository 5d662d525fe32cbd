"""The node list by LIST then WATCH against the fake API server over HTTP: paging, changes
seen through the watch, 410 relists, bookmarks, hostile lines, dropped streams, a slow server."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from adapters.schedulers.base import NodeReadError
from adapters.schedulers.kubernetes.client import KubeClient, connection
from adapters.schedulers.kubernetes.listing import RACK_LABEL
from adapters.schedulers.kubernetes.sink import KubernetesSink
from adapters.schedulers.kubernetes.watch import NodeWatch
from adapters.schedulers.listing import ListedNode
from fakes.kube_api import FakeKubeApi
from policies.model import REASON_PREFIX, Action, Decision, FaultDomain, idempotency_key
from tests.support.stray_cancel import CancelledWithResult
from tests.support.wait import wait_until

NODES = [f"gpu{i:02d}" for i in range(1, 6)]


def drain(node: str, action: Action = Action.DRAIN) -> Decision:
    return Decision(
        node, action, f"{REASON_PREFIX} hot", FaultDomain.GPU, 0.0, idempotency_key(node, action, 1)
    )


@pytest.fixture
async def api() -> AsyncIterator[FakeKubeApi]:
    fake = FakeKubeApi()
    for i, name in enumerate(NODES):
        fake.add_node(name)
        fake.nodes[name]["metadata"]["labels"][RACK_LABEL] = "a" if i < 3 else "b"
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture
async def sink(api: FakeKubeApi, token_file: Path) -> AsyncIterator[KubernetesSink]:
    s = KubernetesSink(KubeClient(connection(api_url=api.url, token_file=token_file)))
    s.watch.page_size = 2
    s.watch._backoff = (0.05, 0.2)
    yield s
    await s.close()


def names(listed: list[ListedNode]) -> set[str]:
    return {n.view.node for n in listed}


async def following(sink: KubernetesSink) -> NodeWatch:
    sink.follow(True)
    await sink.list_nodes()
    await wait_until(lambda: sink.watch._watching_since is not None, what="watch open")
    return sink.watch


async def test_a_paged_list_then_one_watch_sees_a_taint_and_a_condition_change(
    api: FakeKubeApi, sink: KubernetesSink
) -> None:
    w = await following(sink)
    assert names(await sink.list_nodes()) == set(NODES)
    assert (w.pages, w.lists, api.node_lists, api.node_watches) == (3, 1, 3, 1)  # 5 nodes, 2 a page
    assert {n.view.node: n.rack for n in await sink.list_nodes()}["gpu05"] == "b"

    await sink.deliver(drain("gpu03"))  # taint + cordon, then the condition (status)
    await wait_until(lambda: w.resource_version == str(api.resource_version), what="caught up")
    by_name = {n.view.node: n for n in await sink.list_nodes()}
    assert by_name["gpu03"].view.drained and by_name["gpu03"].view.ours
    assert w.events >= 2  # the spec patch and the status patch, each an event
    # Reads while following cost the API server nothing.
    for _ in range(20):
        await sink.list_nodes()
    assert (api.node_lists, api.node_watches, w.relists) == (3, 1, 0)

    api.remove_node("gpu05")
    await wait_until(lambda: "gpu05" not in w.nodes, what="deleted node gone")


async def test_a_compacted_version_is_410_and_lists_again(
    api: FakeKubeApi, sink: KubernetesSink
) -> None:
    w = await following(sink)
    api.drop_watches()  # the stream breaks; meanwhile a change, then etcd compacts
    api.edit_node("gpu02", {"spec": {"unschedulable": True}})
    api.compact()
    await wait_until(lambda: w.relists == 1, what="relist after 410")
    await wait_until(lambda: w.resource_version == str(api.resource_version), what="caught up")
    assert "too old resource version" in w.last_error
    assert w.lists == 2 and w.nodes["gpu02"].view.drained
    assert names(await sink.list_nodes()) == set(NODES)


async def test_a_bookmark_moves_the_version_on_so_a_restart_after_compaction_needs_no_list(
    api: FakeKubeApi, sink: KubernetesSink
) -> None:
    w = await following(sink)
    api.add_pod("ml", "p1", "gpu01")  # other resources move the version; no node event
    api.add_pod("ml", "p2", "gpu02")
    assert w.resource_version != str(api.resource_version)
    api.bookmark()
    await wait_until(lambda: w.bookmarks == 1, what="bookmark taken")
    assert w.resource_version == str(api.resource_version)
    api.compact()  # the version the last node event carried is now too old
    api.drop_watches()
    await wait_until(lambda: w.watches == 2 and w._watching_since is not None, what="rewatch")
    assert (w.relists, w.lists) == (0, 1)


async def test_hostile_lines_are_counted_and_skipped_and_the_watch_goes_on(
    api: FakeKubeApi, sink: KubernetesSink
) -> None:
    w = await following(sink)
    hostile = [
        b"{not json",
        b"\xff\xfe\x00garbage",
        b"[]",
        b'{"type": "ADDED"}',
        b'{"type": "ADDED", "object": {"metadata": {"name": "Bad_Name!"}}}',
        b'{"type": "ADDED", "object": {"metadata": {"name": ""}}}',
        b'{"type": "ADDED", "object": {"metadata": {"name": "gpu66", "labels": [1]}}}',
        b'{"type": "MODIFIED", "object": {"metadata": {"name": "gpu01"}, "spec": {"taints": 7}}}',
        b'{"type": "EXPLODED", "object": {"metadata": {"name": "gpu67"}}}',
        b'{"type": "BOOKMARK", "object": {"metadata": {}}}',
        b'{"type": "ERROR", "object": "not a status"}',
        b'{"type": "ADDED", "object": {"metadata": {"name": "' + b"a" * 300 + b'"}}}',
    ]
    for line in hostile:
        api.inject_watch_line(line)
    api.edit_node("gpu04", {"spec": {"unschedulable": True}})  # a real change after them
    await wait_until(lambda: w.nodes["gpu04"].view.drained, what="real change seen")
    assert w.malformed == len(hostile)
    assert set(w.nodes) == set(NODES)  # no node counted from junk, none dropped
    assert not w.nodes["gpu01"].view.held
    assert (w.watches, w.relists, w.lists) == (1, 0, 1)  # junk never ends the watch


async def test_a_bookmark_with_a_version_the_server_refuses_ends_in_a_list_not_a_loop(
    api: FakeKubeApi, sink: KubernetesSink
) -> None:
    w = await following(sink)
    api.inject_watch_line(
        b'{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "zz"}}}'
    )
    await wait_until(lambda: w.resource_version == "zz", what="hostile bookmark taken")
    api.drop_watches()  # renewed from "zz": 400, so listed again
    await wait_until(lambda: w.relists == 1 and w._watching_since is not None, what="relist")
    assert "HTTP 400" in w.last_error and w.lists == 2
    api.edit_node("gpu01", {"spec": {"unschedulable": True}})
    await wait_until(lambda: w.nodes["gpu01"].view.drained, what="watching again")


async def test_a_list_page_past_the_limit_is_no_read(
    api: FakeKubeApi, sink: KubernetesSink
) -> None:
    api.edit_node("gpu01", {"metadata": {"annotations": {"big": "x" * 50_000}}})
    sink.watch.page_limit = 20_000
    with pytest.raises(NodeReadError, match="an answer over 20000 bytes"):
        await sink.list_nodes()
    sink.watch.page_limit = 64 << 20
    assert names(await sink.list_nodes()) == set(NODES)


async def test_a_line_past_the_limit_ends_that_stream_and_the_watch_resumes_without_a_list(
    api: FakeKubeApi, sink: KubernetesSink
) -> None:
    w = await following(sink)
    api.inject_watch_line(b'{"type": "ADDED", "object": "' + b"x" * (5 << 20) + b'"}')
    await wait_until(lambda: w.watches == 2 and w._watching_since is not None, what="rewatch")
    api.edit_node("gpu01", {"spec": {"unschedulable": True}})
    await wait_until(lambda: w.nodes["gpu01"].view.drained, what="change after resume")
    assert w.malformed == 1 and (w.relists, w.lists) == (0, 1)


async def test_a_dropped_stream_resumes_from_the_last_version_without_a_list(
    api: FakeKubeApi, sink: KubernetesSink
) -> None:
    w = await following(sink)
    for _ in range(3):
        api.drop_watches()
        api.edit_node("gpu02", {"metadata": {"annotations": {"x": str(api.resource_version)}}})
    api.edit_node("gpu02", {"spec": {"unschedulable": True}})
    await wait_until(lambda: w.nodes["gpu02"].view.drained, what="change across drops")
    await wait_until(lambda: w.resource_version == str(api.resource_version), what="caught up")
    assert (w.relists, w.lists, api.node_lists) == (0, 1, 3)
    assert w.watches >= 2


async def test_a_watch_that_times_out_is_renewed_from_its_version(
    api: FakeKubeApi, sink: KubernetesSink
) -> None:
    sink.watch.watch_timeout_s = 1.0  # timeoutSeconds 1..2
    w = await following(sink)
    await wait_until(lambda: w.watches >= 2, timeout=5, what="a second watch")
    api.edit_node("gpu05", {"spec": {"unschedulable": True}})
    await wait_until(lambda: w.nodes["gpu05"].view.drained, what="change after renewal")
    assert (w.relists, w.lists) == (0, 1)


async def test_a_slow_api_server_is_no_read_until_it_answers(
    api: FakeKubeApi, sink: KubernetesSink
) -> None:
    api.slow_s = 1.0
    sink.follow(True)
    with pytest.raises(NodeReadError, match="no list yet"):
        await sink.watch.current(wait_s=0.3)
    assert names(await sink.watch.current(wait_s=10)) == set(NODES)
    api.slow_s = 0.0


async def test_a_stream_that_goes_silent_is_given_up_and_renewed_from_its_version(
    api: FakeKubeApi, sink: KubernetesSink
) -> None:
    sink.watch.idle_s = 0.5  # no event, no bookmark for that long: a hung server
    w = await following(sink)
    await wait_until(lambda: w.watches >= 3, timeout=10, what="renewed after silence")
    assert "Timeout" in w.last_error and (w.relists, w.lists) == (0, 1)
    api.edit_node("gpu03", {"spec": {"unschedulable": True}})
    await wait_until(lambda: w.nodes["gpu03"].view.drained, what="change after renewal")


async def test_a_broken_watch_is_stale_after_stale_s(
    api: FakeKubeApi, sink: KubernetesSink
) -> None:
    w = await following(sink)
    w.stale_s = 0.3
    await api.stop()  # the server goes away: the watch breaks, cannot be renewed
    await wait_until(lambda: w._lost_at is not None, what="watch lost")
    assert names(await w.current()) == set(NODES)  # still fresh enough
    await wait_until(lambda: w.stale, timeout=5, what="stale")
    port = int(api.url.rsplit(":", 1)[1])
    await api.start(port)
    await wait_until(lambda: not w.stale, timeout=10, what="fresh again")


async def test_the_own_node_by_field_selector_sees_only_itself(
    api: FakeKubeApi, token_file: Path
) -> None:
    client = KubeClient(connection(api_url=api.url, token_file=token_file))
    sink = KubernetesSink(client)
    own = NodeWatch(client, sink._view, node="gpu02")
    try:
        own.follow(True)
        assert names(await own.current()) == {"gpu02"}
        api.edit_node("gpu01", {"spec": {"unschedulable": True}})  # another node: not sent
        api.edit_node("gpu02", {"spec": {"unschedulable": True}})
        await wait_until(lambda: own.nodes["gpu02"].view.drained, what="own change")
        assert own.events == 1 and set(own.nodes) == {"gpu02"}
        # A server that sends another node anyway is not believed.
        api.inject_watch_line(
            b'{"type": "ADDED", "object": {"metadata": {"name": "gpu03", "resourceVersion": "1"}}}'
        )
        api.edit_node("gpu02", {"spec": {"unschedulable": False}})
        await wait_until(lambda: not own.nodes["gpu02"].view.drained, what="own change 2")
        assert set(own.nodes) == {"gpu02"} and own.malformed == 1
    finally:
        await own.stop()
        await sink.close()


async def test_stopping_the_watch_drops_it_and_reads_are_paged_lists_again(
    api: FakeKubeApi, sink: KubernetesSink
) -> None:
    await following(sink)
    sink.follow(False)
    await wait_until(lambda: not api.watchers, what="stream closed on the server")
    before = api.node_lists
    assert names(await sink.list_nodes()) == set(NODES)
    assert api.node_lists == before + 3


def gpu_node_status(api: FakeKubeApi, name: str, images: int) -> None:
    """Fill a fake node as a kubelet and GPU feature discovery would (sizes, not meaning)."""
    node = api.nodes[name]
    node["metadata"]["labels"].update(
        {f"nvidia.com/gpu.{k}": "x" * 12 for k in ("product", "memory", "count", "family")}
        | {f"feature.node.kubernetes.io/cpu-{i}": "true" for i in range(12)}
        | {"kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux", RACK_LABEL: "rack-17"}
    )
    cond = {
        "status": "False",
        "lastHeartbeatTime": "2026-12-05T03:00:00Z",
        "lastTransitionTime": "2026-11-01T00:00:00Z",
        "reason": "KubeletHasSufficientMemory",
        "message": "kubelet has sufficient memory available",
    }
    resources = {"cpu": "128", "memory": "2113464148Ki", "nvidia.com/gpu": "8", "pods": "110"}
    node["status"] = {
        "conditions": [{**cond, "type": t} for t in ("MemoryPressure", "DiskPressure", "PID",
                                                      "Ready", "NetworkUnavailable")],
        "addresses": [{"type": "InternalIP", "address": "10.1.2.3"},
                      {"type": "Hostname", "address": name}],
        "capacity": resources,
        "allocatable": resources,
        "nodeInfo": {k: "x" * 36 for k in ("machineID", "systemUUID", "bootID", "kernelVersion",
                                           "osImage", "containerRuntimeVersion", "kubeletVersion")},
        "images": [
            {"names": [f"nvcr.io/nvidia/pytorch@sha256:{'a' * 64}", f"nvcr.io/x/img{i}:24.11"],
             "sizeBytes": 9876543210}
            for i in range(images)
        ],
    }  # fmt: skip


@pytest.mark.parametrize("images", [0, 10])
async def test_watch_cost_measured_on_the_fakes_node_objects(images: int, token_file: Path) -> None:
    """The sizes docs/fleet.md's Kubernetes cost table is computed from (``-s`` prints them)."""
    api = FakeKubeApi()
    for i in range(1000):
        api.add_node(f"gpu{i:04d}")
        gpu_node_status(api, f"gpu{i:04d}", images)
    await api.start()
    client = KubeClient(connection(api_url=api.url, token_file=token_file))
    sink = KubernetesSink(client)
    try:
        w = sink.watch
        w.follow(True)
        await w.current()
        await wait_until(lambda: w._watching_since is not None, what="watch open")
        assert (w.pages, api.node_lists) == (2, 2)  # 1,000 nodes, limit=500
        list_bytes = api.node_bytes
        api.edit_node("gpu0007", {"metadata": {"annotations": {"x": "y"}}})
        await wait_until(lambda: w.events == 1, what="event")
        event = api.node_bytes - list_bytes
        api.bookmark()
        await wait_until(lambda: w.bookmarks == 1, what="bookmark")
        mark = api.node_bytes - list_bytes - event
    finally:
        await sink.close()
        await api.stop()
    node = list_bytes / 1000
    assert node * 0.9 < event < node * 1.2 + 200  # one event: one node object
    rows = []
    for n in (1000, 10000):
        updates = n / 300  # each kubelet's status every nodeStatusReportFrequency (5 min)
        rows.append(
            f"N={n}: node {node:.0f} B, event {event} B, bookmark {mark} B | "
            f"LIST every 10 s per agent {n / 10:.0f} req/s {n / 10 * n * node / 1e6:.0f} MB/s | "
            f"budget LIST 0.5/s {0.5 * -(-n // 500):.1f} req/s {0.5 * n * node / 1e6:.1f} MB/s | "
            f"one watch {1 / 450:.4f} req/s {(updates * event + mark / 60) / 1e3:.0f} kB/s | "
            f"watch per agent {n / 450:.0f} req/s {n * updates * event / 1e6:.0f} MB/s"
        )
    print("\n" + "\n".join(rows))


@pytest.mark.parametrize(
    ("ending", "said"),
    [
        (CancelledWithResult(), "by a cancellation no one asked for"),  # the HTTP client's own
        (RuntimeError("a bug"), "by an error: RuntimeError('a bug')"),
    ],
)
async def test_a_watch_that_ended_by_itself_is_said_and_started_again(
    api: FakeKubeApi,
    sink: KubernetesSink,
    caplog: pytest.LogCaptureFixture,
    ending: BaseException,
    said: str,
) -> None:
    w = await following(sink)
    ended = w._task
    resume = w._watch_once

    async def end() -> bool:
        w._watch_once = resume  # type: ignore[method-assign]
        raise ending

    w._watch_once = end  # type: ignore[method-assign]
    api.drop_watches()  # the stream ends; the next one ends the task
    await wait_until(lambda: ended is not None and ended.done(), what="the watch task ended")
    sink.follow(True)  # the view's next pass
    (error,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert error.getMessage() == f"node watch: ended {said}; starting it again"
    api.edit_node("gpu04", {"spec": {"unschedulable": True}})
    await wait_until(lambda: w.nodes["gpu04"].view.drained, what="watched again")
    assert w.lists == 1  # resumed from its version


async def test_a_stop_as_the_first_list_arrives_is_not_lost(sink: KubernetesSink) -> None:
    w = sink.watch

    async def view_pass() -> None:
        await w.current(wait_s=10)
        await asyncio.sleep(3600)  # what the caller does next

    task = asyncio.create_task(view_pass())
    await asyncio.sleep(0)  # waiting for the first list
    w.synced.set()  # the list arrives, and a stop in the same turn
    asyncio.get_running_loop().call_soon(task.cancel)
    await asyncio.sleep(0.1)
    # Before: wait_for (3.11) returned, the stop was dropped, the caller went on.
    assert task.cancelled()
    w.synced.clear()
