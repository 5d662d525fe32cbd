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
    """A decision could not be delivered, and why (``reason``: a short metric label).

    Three kinds, because they call for three answers:

    - transient (the default): the scheduler is unreachable or busy; retried soon;
    - ``permanent``: refused for a cause an operator can fix (a rotated key, a
      missing permission, a node not registered yet, a receiver mid-deploy):
      retried with a long backoff and reported until it is fixed;
    - ``final``: the request itself is malformed; sending it again cannot help.
    """

    def __init__(
        self, message: str, *, permanent: bool = False, final: bool = False, reason: str = ""
    ) -> None:
        super().__init__(message)
        self.final = final
        self.permanent = permanent or final
        default = "malformed" if final else "refused" if permanent else "unreachable"
        self.reason = reason or default


def http_error(message: str, status: int) -> DeliveryError:
    """The DeliveryError for an HTTP error status from a scheduler or receiver.

    400, 405, 415 and 422 say the request itself is wrong (final); 401/403
    (auth), 404 (not found) and the other refusals need an operator (permanent);
    408, 409, 425, 429 and 5xx are transient.
    """
    if status in (400, 405, 415, 422):
        return DeliveryError(message, final=True, reason="malformed")
    if status in (401, 403, 407, 511):
        return DeliveryError(message, permanent=True, reason="auth")
    if status == 404:
        return DeliveryError(message, permanent=True, reason="not_found")
    if 400 <= status < 500 and status not in (408, 409, 425, 429):
        return DeliveryError(message, permanent=True, reason="refused")
    return DeliveryError(message)


class SchedulerSink(Protocol):
    """Delivers decisions to a scheduler; returns only once the scheduler confirmed."""

    name: str

    async def deliver(self, decision: Decision) -> None:
        """Apply one decision; raise DeliveryError when it was not confirmed."""

    async def close(self) -> None:
        """Release connections; never raises."""
