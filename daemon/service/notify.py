"""systemd's notify protocol (sd_notify) without libsystemd: one datagram per message.

Under `Type=notify`, systemd passes NOTIFY_SOCKET; with `WatchdogSec=` it also
passes WATCHDOG_USEC (and WATCHDOG_PID). Outside systemd every call is a no-op.
"""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger(__name__)


class Notifier:
    """Sends READY=1, STATUS=..., WATCHDOG=1 and STOPPING=1 to the service manager."""

    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self._address = _address(env.get("NOTIFY_SOCKET", ""))
        self._sock: socket.socket | None = None
        self.watchdog_s: float | None = None
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        if usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            self.watchdog_s = int(usec) / 1e6
        self._last_status = ""

    @property
    def enabled(self) -> bool:
        """True when a service manager listens."""
        return self._address is not None

    def send(self, *fields: str) -> None:
        """Send one message of KEY=VALUE fields; errors are logged, never raised."""
        if self._address is None:
            return
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                # Never block the event loop on a slow reader: a full queue drops
                # the message (a missed WATCHDOG=1 is resent at the next ping).
                self._sock.setblocking(False)
            self._sock.sendto("\n".join(fields).encode(), self._address)
        except BlockingIOError:
            log.debug("sd_notify queue full, dropped %s", fields[0])
        except OSError as err:
            log.warning("sd_notify to %r failed: %s", self._address, err)

    def ready(self, status: str) -> None:
        """The service is up: API bound, every source tried once."""
        self._last_status = status
        self.send("READY=1", f"STATUS={status}")

    def status(self, status: str) -> None:
        """A one-line summary for `systemctl status`; sent only when it changes."""
        if status != self._last_status:
            self._last_status = status
            self.send(f"STATUS={status}")

    def watchdog(self) -> None:
        """Proof of life from the main loop."""
        self.send("WATCHDOG=1")

    def stopping(self) -> None:
        """Shutdown has begun."""
        self.send("STOPPING=1")

    def reloading(self) -> None:
        """A reload has begun (READY=1 follows when it is done)."""
        self.send("RELOADING=1")

    def close(self) -> None:
        """Close the socket."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _address(value: str) -> str | bytes | None:
    if not value:
        return None
    if value.startswith("@"):  # abstract namespace
        return b"\0" + value[1:].encode()
    if value.startswith("/"):
        return value
    return None
