"""The node list by LIST then WATCH against the fake API server over HTTP: paging, changes
seen through the watch, 410 relists, bookmarks, hostile lines, dropped streams, a slow server."""

from __future__ import annotations

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
