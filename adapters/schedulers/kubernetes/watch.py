"""The node list kept current by one LIST and then one WATCH, as client-go's reflector keeps it.

- LIST ``/api/v1/nodes`` ``limit`` nodes a page, following ``continue``; a page
  whose token expired (410) starts the list again whole.
- WATCH from the list's ``resourceVersion`` with ``allowWatchBookmarks=true``
  and ``timeoutSeconds`` (5 to 10 min, as the reflector's ``minWatchTimeout``
  times 1 + rand). Every event, a ``BOOKMARK`` included, moves the version
  on; a stream that ends (its timeout) or breaks (a dropped connection, a
  server silent for ``idle_s``) is watched again from the last version seen:
  no relist.
- 410 Gone (``too old resource version``: the version was compacted), as an
  ``ERROR`` event or as the watch's HTTP status, or any other 4xx refusal of
  the watch but 401, 403 and 429: LIST again, after a backoff that doubles
  while it keeps happening.
- Everything from the API server is hostile input: each line is decoded
  through the models below (msgspec). A line that does not decode, an
  object that is not a node, a name no node could have: counted in
  ``malformed`` and skipped; it never ends the watch, never adds a node.

``fieldSelector=metadata.name=<node>`` keeps one node (the agent's own) for
the cost of one object's events.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar
from urllib.parse import urlencode

import msgspec

from adapters.base import DeliveryError
from adapters.schedulers.base import NodeReadError, NodeView
from adapters.schedulers.bounded import read_error_body
from adapters.schedulers.kubernetes.client import KubeClient, node_error
from adapters.schedulers.kubernetes.listing import listed_kube
from adapters.schedulers.listing import ListedNode

log = logging.getLogger(__name__)
_T = TypeVar("_T")

MIN_WATCH_TIMEOUT_S = 300.0  # client-go reflector.go minWatchTimeout
_RETRY = {401, 403, 429}  # the same watch again after the backoff: a LIST would not help
# A node's name is a DNS-1123 subdomain (kubernetes ValidateNodeName).
_NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


class _Meta(msgspec.Struct, frozen=True, rename="camel"):
    name: str = ""
    resource_version: str = ""
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}


class _Taint(msgspec.Struct, frozen=True):
    key: str
    effect: str
    value: str = ""


class _Spec(msgspec.Struct, frozen=True):
    taints: list[_Taint] = []
    unschedulable: bool = False


class _Node(msgspec.Struct, frozen=True):
    metadata: _Meta
    spec: _Spec = _Spec()


class _ListMeta(msgspec.Struct, frozen=True, rename="camel"):
    resource_version: str = ""
    next: str = msgspec.field(default="", name="continue")


class _NodeList(msgspec.Struct, frozen=True):
    metadata: _ListMeta
    items: list[msgspec.Raw] = []


class _Event(msgspec.Struct, frozen=True):
    type: str
    object: msgspec.Raw


class _Status(msgspec.Struct, frozen=True):
    code: int = 0
    reason: str = ""
    message: str = ""


class _VersionOnly(msgspec.Struct, frozen=True):
    metadata: _Meta


class Expired(Exception):
    """Only a new LIST goes on from here: 410 Gone (the version asked for is compacted), or
    the watch request refused outright (a version the server does not take)."""


class NodeWatch:
    """All nodes (or one, by field selector) as of the last event: LIST, then WATCH."""

    def __init__(
        self,
        client: KubeClient,
        view: Callable[[Mapping[str, Any]], NodeView],
        *,
        node: str = "",
        page_size: int = 500,
        watch_timeout_s: float = MIN_WATCH_TIMEOUT_S,
        backoff_s: tuple[float, float] = (0.8, 30.0),
        stale_s: float = 60.0,
        idle_s: float = 120.0,
        line_limit: int = 4 << 20,
        rng: random.Random | None = None,
    ) -> None:
        self.client = client
        self._view = view
        self.node = node  # "" = every node
        self.page_size = page_size
        self.watch_timeout_s = watch_timeout_s
        self._backoff = backoff_s
        self.line_limit = line_limit  # bytes of one event (a node is some KB)
        self.page_limit = 64 << 20  # bytes of one LIST page (500 nodes: a few MB)
        self.stale_s = stale_s  # a cache not watched for this long is not a read
        # A stream silent this long is taken as gone (the API server's bookmarks come about
        # once a minute; renewing a quiet watch from its version costs one request).
        self.idle_s = idle_s
        self._rng = rng or random.Random()
        self.nodes: dict[str, ListedNode] = {}
        self.resource_version = ""
        self.synced = asyncio.Event()
        self.lists = 0  # whole lists (one or more pages)
        self.pages = 0  # LIST requests
        self.watches = 0  # WATCH requests
        self.relists = 0  # lists again after a 410
        self.bookmarks = 0
        self.events = 0  # ADDED, MODIFIED, DELETED taken
        self.malformed = 0  # lines, objects or items that did not decode: skipped
        self.last_error = ""
        self._watching_since: float | None = None  # monotonic: a stream is open
        self._lost_at: float | None = None  # monotonic: the last stream broke or failed
        self._task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ use

    @property
    def following(self) -> bool:
        """The watch runs (started, not stopped)."""
        return self._task is not None and not self._task.done()

    def follow(self, on: bool) -> None:
        """Start (or stop) keeping the list by watch; stopping drops the cache."""
        if on and not self.following:
            self._ended()
            self._task = asyncio.get_running_loop().create_task(self.run(), name="node-watch")
        elif not on and self._task is not None:
            self._task.cancel()
            self._task = None
            self._forget()

    def _ended(self) -> None:
        """Say why a watch that runs until stopped ended by itself (a bug, or a library's)."""
        task = self._task
        if task is None or not task.done():
            return  # never started, or stopped by us
        err = None if task.cancelled() else task.exception()
        why = (
            "by a cancellation no one asked for"
            if task.cancelled()
            else f"by an error: {err!r}"
            if err
            else "(returned)"
        )
        log.error("node watch: ended %s; starting it again", why, exc_info=err)

    async def stop(self) -> None:
        """Stop the watch and wait for it."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self._forget()

    def _forget(self) -> None:
        self.nodes = {}
        self.resource_version = ""
        self.synced.clear()
        self._watching_since = self._lost_at = None

    @property
    def stale(self) -> bool:
        """No stream open, and none for longer than ``stale_s``."""
        lost = self._lost_at
        return (
            self._watching_since is None
            and lost is not None
            and (time.monotonic() - lost > self.stale_s)
        )

    async def current(self, wait_s: float = 10.0) -> list[ListedNode]:
        """The nodes as of the last event; NodeReadError before the first list or when stale."""
        if not self.synced.is_set():
            try:
                # Not wait_for: on 3.11 it drops a stop that lands as the list arrives.
                async with asyncio.timeout(wait_s):
                    await self.synced.wait()
            except TimeoutError:
                raise NodeReadError(
                    f"node watch: no list yet: {self.last_error or 'waiting for the API server'}"
                ) from None
        if self.stale:
            raise NodeReadError(f"node watch broken for {self.stale_s:g} s: {self.last_error}")
        return list(self.nodes.values())

    # ------------------------------------------------------------------ list

    def _query(self, **extra: str) -> str:
        query = {"fieldSelector": f"metadata.name={self.node}"} if self.node else {}
        return "/api/v1/nodes?" + urlencode({**query, **extra})

    def _decode_node(self, raw: bytes | msgspec.Raw) -> tuple[str, ListedNode, str] | None:
        """(name, the listed node, its resourceVersion), or None (counted) for junk."""
        node = self._decode(raw, _Node)
        if node is None:
            return None
        name = node.metadata.name
        if len(name) > 253 or _NODE_NAME.fullmatch(name) is None:
            self.malformed += 1
            return None
        builtin = msgspec.to_builtins(node)
        return name, listed_kube(builtin, self._view(builtin)), node.metadata.resource_version

    async def list_all(self) -> tuple[dict[str, ListedNode], str]:
        """One whole LIST, page by page: the nodes and the list's resourceVersion."""
        nodes: dict[str, ListedNode] = {}
        token, restarted = "", False
        while True:
            extra = {"limit": str(self.page_size)} if self.page_size else {}
            if token:
                extra["continue"] = token
            try:
                status, raw = await self.client.get_bytes(
                    self._query(**extra), limit=self.page_limit
                )
            except DeliveryError as err:
                raise NodeReadError(str(err), permanent=err.permanent) from err
            self.pages += 1
            if status == 410 and token and not restarted:
                # The continue token outlived its revision (client-go's pager falls back
                # to a full list the same way): once from the start, consistent again.
                nodes, token, restarted = {}, "", True
                continue
            if status != 200:
                raise NodeReadError(str(node_error("list nodes", status, _message(raw))))
            try:
                page = msgspec.json.decode(raw, type=_NodeList)
            except (msgspec.ValidationError, msgspec.DecodeError) as err:
                raise NodeReadError(f"list nodes: not a NodeList: {err}") from err
            for item in page.items:
                got = self._decode_node(item)
                if got is not None:
                    nodes[got[0]] = got[1]
            token = page.metadata.next
            if not token:
                self.lists += 1
                return nodes, page.metadata.resource_version

    # ------------------------------------------------------------------ watch

    async def run(self) -> None:
        """LIST, then WATCH for as long as it runs; until cancelled."""
        fails = 0
        while True:
            try:
                if not self.resource_version:
                    self.nodes, self.resource_version = await self.list_all()
                    self.synced.set()
                if await self._watch_once():
                    fails = 0  # a stream that carried events or ran its course
                    continue
            except Expired as err:
                self.relists += 1
                self.resource_version = ""
                self.last_error = str(err)
                log.info("node watch: %s; listing again", err)
            except (NodeReadError, DeliveryError) as err:
                if self.last_error != str(err):
                    log.warning("node watch: %s", err)
                self.last_error = str(err)
            self._watching_since = None
            self._lost_at = self._lost_at or time.monotonic()
            fails += 1
            low, high = self._backoff
            await asyncio.sleep(min(high, low * 2 ** (fails - 1)) * self._rng.uniform(0.5, 1.0))

    async def _watch_once(self) -> bool:
        """One WATCH stream; True when it ended well (carried events or timed out)."""
        timeout = int(self.watch_timeout_s * (1.0 + self._rng.random()))
        path = self._query(
            watch="1",
            resourceVersion=self.resource_version,
            allowWatchBookmarks="true",
            timeoutSeconds=str(timeout),
        )
        self.watches += 1
        taken = 0
        started = time.monotonic()
        async with self.client.stream(path, idle_timeout_s=self.idle_s) as resp:
            # As the reflector: a watch refused (not for auth, load or a server fault) is
            # relisted, so a version the server will not take cannot wedge the watch.
            if resp.status == 410 or (400 <= resp.status < 500 and resp.status not in _RETRY):
                raise Expired(f"watch: HTTP {resp.status}: {_message(await read_error_body(resp))}")
            if resp.status != 200:
                raise NodeReadError(
                    str(
                        node_error(
                            "watch nodes", resp.status, _message(await read_error_body(resp))
                        )
                    )
                )
            self._watching_since, self._lost_at = time.monotonic(), None
            # A broken stream (aiohttp's errors, a silent server) leaves as DeliveryError.
            buf = bytearray()
            async for chunk in resp.content.iter_any():
                buf += chunk
                while (end := buf.find(b"\n")) >= 0:
                    taken += self._take(bytes(buf[:end]))
                    del buf[: end + 1]
                if len(buf) > self.line_limit:  # the stream can no longer be trusted
                    self.malformed += 1
                    raise NodeReadError(f"watch: a line over {self.line_limit} bytes")
        self._watching_since, self._lost_at = None, time.monotonic()
        # client-go's "very short watch": closed at once with nothing in it is a failure.
        return taken > 0 or time.monotonic() - started >= 1.0

    def _decode(self, raw: bytes | msgspec.Raw, model: type[_T]) -> _T | None:
        """``raw`` through ``model``; None, counted in ``malformed``, when it does not fit."""
        try:
            return msgspec.json.decode(raw, type=model)
        except (msgspec.ValidationError, msgspec.DecodeError):
            self.malformed += 1
            return None

    def _take(self, line: bytes) -> int:
        """Apply one event line; 1 when it moved the version on."""
        if not line.strip():
            return 0
        event = self._decode(line, _Event)
        if event is None:
            return 0
        if event.type == "ERROR":
            status = self._decode(event.object, _Status)
            if status is None:
                return 0
            if status.code == 410:
                raise Expired(f"watch: {status.message or status.reason}")
            raise NodeReadError(f"watch: ERROR {status.code} {status.reason}: {status.message}")
        if event.type == "BOOKMARK":
            mark = self._decode(event.object, _VersionOnly)
            if mark is None:
                return 0
            if not mark.metadata.resource_version:
                self.malformed += 1
                return 0
            self.bookmarks += 1
            self.resource_version = mark.metadata.resource_version
            return 1
        if event.type not in ("ADDED", "MODIFIED", "DELETED"):
            self.malformed += 1
            return 0
        got = self._decode_node(event.object)
        if got is None:
            return 0
        name, listed, rv = got
        if self.node and name != self.node:
            self.malformed += 1  # not what the selector asked for
            return 0
        if event.type == "DELETED":
            self.nodes.pop(name, None)
        else:
            self.nodes[name] = listed
        self.resource_version = rv or self.resource_version
        self.events += 1
        return 1


def _message(raw: bytes) -> Any:
    """A Status body's message (or the first bytes), for an error."""
    try:
        return {"message": msgspec.json.decode(raw, type=_Status).message}
    except (msgspec.ValidationError, msgspec.DecodeError):
        return {"message": raw[:200].decode(errors="replace")}
