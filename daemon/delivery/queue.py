"""Hands decisions to the scheduler sink: the durable outbox, under its historical name.

``DeliveryQueue(sink, ...)`` keeps the in-memory behaviour of the first
version (an outbox in a private in-memory database); pass ``path`` to make it
survive restarts.
"""

from __future__ import annotations

import random
from pathlib import Path

from adapters.base import SchedulerSink
from daemon.delivery.outbox import MEMORY, Outbox, Pending, Record, Sleep, Status, wait_or_wake

__all__ = ["DeliveryQueue", "Pending", "Record", "Status"]


class DeliveryQueue(Outbox):
    """An Outbox; in memory unless ``path`` names a database file."""

    def __init__(
        self,
        sink: SchedulerSink | None,
        *,
        path: Path | str = MEMORY,
        retry_initial_s: float = 1.0,
        retry_max_s: float = 60.0,
        rng: random.Random | None = None,
        sleep: Sleep = wait_or_wake,
    ) -> None:
        super().__init__(
            path,
            sink,
            retry_initial_s=retry_initial_s,
            retry_max_s=retry_max_s,
            rng=rng,
            sleep=sleep,
        )
