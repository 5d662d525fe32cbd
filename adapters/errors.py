"""The few errors an adapter may raise; each maps to one action of the runner."""

from __future__ import annotations


class SourceError(Exception):
    """Base: the device as a whole could not be read."""


class SourceUnavailable(SourceError):
    """Unreachable, timed out or busy: keep polling with backoff."""


class SourceAuthError(SourceError):
    """Credentials refused: keep trying slowly, and say so loudly."""


class SourceSetupError(SourceError):
    """Cannot work as configured (no driver, no library, no permission, bad profile).

    Raised on the first connect this stops `rackguard run` with the message, since
    retrying cannot fix it; later it is treated like SourceUnavailable.
    """


class SourceMismatch(SourceSetupError):
    """The device works, but is not what the config names (a GPU index the node lacks).

    A config error found on the node: check-config reports it too, where a missing
    driver or an unreachable device is the machine's state, not the file's.
    """


class SourceBadData(SourceError):
    """The device answered with something that cannot be parsed at all."""
