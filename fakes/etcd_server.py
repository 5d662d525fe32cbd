"""A real etcd (Debian's etcd-server) on loopback with a temporary data directory.

Not a fake: the tests and the bench start the real server; this only picks free
ports, waits for ``/health`` and stops it (``stop`` keeps the data directory,
so ``start`` again is the same cluster coming back, on the same ports).
"""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from fakes.processes import stop_process


def etcd_available() -> str:
    """Why etcd cannot be started here ("" when it can)."""
    if shutil.which("etcd") is None:
        return "etcd is not installed (scripts/install-etcd.sh installs Debian's etcd-server)"
    return ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EtcdServer:
    """One etcd member on 127.0.0.1."""

    def __init__(
        self,
        data_dir: Path | None = None,
        *,
        tls_args: tuple[str, ...] = (),
        health_tls: ssl.SSLContext | None = None,
    ) -> None:
        """``tls_args``: etcd's --cert-file/--key-file/... flags; the URL is then https://."""
        self._tmp = None if data_dir else tempfile.TemporaryDirectory(prefix="rackguard-etcd-")
        self.data_dir = data_dir or Path(self._tmp.name if self._tmp else ".")
        self.client_port = _free_port()
        self.peer_port = _free_port()
        scheme = "https" if tls_args else "http"
        self.url = f"{scheme}://127.0.0.1:{self.client_port}"
        self._tls_args = tls_args
        self._health_tls = health_tls
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.data_dir / "etcd.log"

    def start(self, timeout_s: float = 20.0) -> str:
        """Start (or restart) the member; return its client URL once healthy."""
        peer = f"http://127.0.0.1:{self.peer_port}"
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    "etcd",
                    "--name=default",
                    f"--data-dir={self.data_dir / 'member-data'}",
                    f"--listen-client-urls={self.url}",
                    f"--advertise-client-urls={self.url}",
                    f"--listen-peer-urls={peer}",
                    f"--initial-advertise-peer-urls={peer}",
                    f"--initial-cluster=default={peer}",
                    "--log-level=warn",
                    *self._tls_args,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + timeout_s
        while not self.healthy():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log_path.read_text(errors="replace")[-2000:]
                self.stop()
                raise RuntimeError(f"etcd did not become healthy: {tail}")
            time.sleep(0.05)
        return self.url

    def healthy(self) -> bool:
        """GET /health says true."""
        try:
            with urllib.request.urlopen(
                self.url + "/health", timeout=1.0, context=self._health_tls
            ) as resp:
                return b'"true"' in resp.read()
        except (urllib.error.URLError, OSError):
            return False

    def pid(self) -> int | None:
        """The server's process id (for CPU accounting)."""
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def wipe(self) -> None:
        """Stopped, lose every key and lease (a member rebuilt from nothing)."""
        assert self.proc is None, "stop() first"
        shutil.rmtree(self.data_dir / "member-data", ignore_errors=True)

    def stop(self) -> None:
        """Stop the member; the data stays for a restart."""
        stop_process(self.proc, grace_s=5.0)
        self.proc = None

    def close(self) -> None:
        """Stop and remove the data directory."""
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
