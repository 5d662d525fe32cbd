"""Contracts between the daemon and the edges: sensor adapters and scheduler sinks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from policies.model import Decision, Reading


class SensorAdapter(Protocol):
    """Speaks one protocol to one device. It does not sleep, retry, schedule or log repeats.

    A sensor that fails inside a good read is a BAD Reading with a reason; a device
    that cannot be read raises one of adapters.errors, chained with ``from err``.
    """

    name: str

    async def connect(self) -> None:
        """Open the session; safe to call again after close()."""

    async def read(self) -> Sequence[Reading]:
        """One poll of every sensor of the device."""

    async def close(self) -> None:
        """Release the session; never raises."""


class DeliveryError(Exception):
    """A decision could not be delivered; ``permanent`` means retrying cannot help."""

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


class SchedulerSink(Protocol):
    """Delivers decisions to a scheduler; returns only once the scheduler confirmed."""

    name: str

    async def deliver(self, decision: Decision) -> None:
        """Apply one decision; raise DeliveryError when it was not confirmed."""

    async def close(self) -> None:
        """Release connections; never raises."""
