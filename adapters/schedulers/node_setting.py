"""A node setting the scheduler uses to place new work (Slurm Weight, a Kubernetes label).

Steering (daemon/service/steering.py) reads it, decides, and writes it back only
if nobody changed it in between: ``write`` takes the value it expects to replace.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class SettingChanged(Exception):
    """The setting was not the expected value when written: someone else changed it."""


class NodeSetting(Protocol):
    """One setting of a node; values are strings, None where it is not set."""

    @property
    def target(self) -> str:
        """What it is, for logs, the API and the outbox ("slurm weight", "kubernetes label K")."""

    def value(self, bucket: int, weights: Sequence[int]) -> str:
        """The value that publishes headroom ``bucket`` (0: least); ``weights``, one a bucket."""

    def writable(self, value: str | None) -> bool:
        """Whether rackguard could write ``value`` (to restore it): the scheduler's own limits."""

    async def read(self, node: str) -> str | None:
        """The value now; raises DeliveryError when the scheduler cannot be read."""

    async def write(self, node: str, value: str | None, expected: str | None) -> None:
        """Set ``value`` (None: remove), where the value now is ``expected``.

        Raises SettingChanged where the scheduler can tell it is not (a compare and
        set); DeliveryError when the write failed (``permanent`` or ``final``: the
        scheduler refused the value itself; asking again cannot help).
        """
