"""An in-process event hub for the Server-Sent Events stream (/v1/events).

Events get increasing ids; the last ``capacity`` are kept so a client that
reconnects with Last-Event-ID receives what it missed. A subscriber that
falls too far behind is dropped (it reconnects and resumes from its id).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from daemon.delivery.deliverer import confirmed_by
from daemon.delivery.outbox import Row
from daemon.delivery.overrides import AuditEntry
from daemon.http.bodies import DeliveryEvent, encode
from daemon.http.notice import Notice
from daemon.service.power_cap import CapRecord
from policies.model import Assessment, Decision


@dataclass(frozen=True, slots=True)
class Event:
    """One event, already encoded for the wire."""

    id: int
    kind: str
    data: bytes

    def encode(self) -> bytes:
        """The SSE frame."""
        return b"id: %d\nevent: %s\ndata: %s\n\n" % (self.id, self.kind.encode(), self.data)


# Each kind of event and the model of its data (documented in /openapi.json).
EVENT_DATA: Mapping[str, type] = MappingProxyType(
    {
        "assessment": Assessment,
        "decision": Decision,
        "delivery": DeliveryEvent,
        "override": AuditEntry,
        "notice": Notice,
        "power_cap": CapRecord,
    }
)


def delivery_event(row: Row) -> DeliveryEvent:
    """The ``delivery`` event: where a decision's delivery now stands."""
    d = row.decision
    return DeliveryEvent(
        d.node,
        d.action,
        d.key,
        row.status,
        row.outcome,
        row.seq,
        row.attempts,
        row.last_error,
        confirmed_by(row.status, row.outcome),
        row.done_at,
    )


class EventHub:
    """Fan-out of events to SSE subscribers, with a replay buffer."""

    def __init__(self, capacity: int = 1000, subscriber_queue: int = 256) -> None:
        self._buffer: deque[Event] = deque(maxlen=capacity)
        self._next_id = 1
        self._subscribers: set[asyncio.Queue[Event | None]] = set()
        self._queue_size = subscriber_queue

    @property
    def last_id(self) -> int:
        """The id of the newest event (0 before any)."""
        return self._next_id - 1

    @property
    def subscriber_count(self) -> int:
        """How many streams are open now."""
        return len(self._subscribers)

    def publish(self, kind: str, data: Any) -> Event:
        """Send an event (``data`` a model of EVENT_DATA[kind]) to every subscriber; keep it."""
        event = Event(self._next_id, kind, encode(data))
        self._next_id += 1
        self._buffer.append(event)
        for q in list(self._subscribers):
            try:
                q.put_nowait(event)
            except asyncio.QueueFull:
                # Too slow: end its stream now, without the queued events, so
                # its Last-Event-ID stays before everything it has not seen and
                # a reconnect replays them from the buffer.
                self._subscribers.discard(q)
                while not q.empty():
                    q.get_nowait()
                q.put_nowait(None)
        return event

    def close(self) -> None:
        """End every subscriber's stream (shutdown); clients reconnect to the next process."""
        for q in list(self._subscribers):
            while not q.empty():
                q.get_nowait()
            q.put_nowait(None)
        self._subscribers.clear()

    def replay(self, after: int) -> list[Event]:
        """Kept events with an id above ``after``."""
        return [e for e in self._buffer if e.id > after]

    async def subscribe(self, after: int) -> AsyncGenerator[Event, None]:
        """Events after ``after``: first the kept ones, then live ones."""
        q: asyncio.Queue[Event | None] = asyncio.Queue(self._queue_size)
        self._subscribers.add(q)
        try:
            last = after
            for event in self.replay(after):
                last = event.id
                yield event
            while True:
                live = await q.get()
                if live is None:
                    return
                if live.id > last:
                    last = live.id
                    yield live
        finally:
            self._subscribers.discard(q)
