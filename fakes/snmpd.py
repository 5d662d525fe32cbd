"""net-snmp's snmpd in the foreground on loopback: an independent agent for interop and bench.

It serves fixed values through ``override`` lines and SNMPv3 users through
``createUser`` (FIELD-NOTES: snmpd will not start as a service in these containers,
so it runs in the foreground with its own persistent directory).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import BinaryIO

from fakes.processes import stop_process
from fakes.snmp_agent import OidTuple, Value
from fakes.snmp_recording import free_udp_port, snmp_get_blocking

ROOT = Path(__file__).resolve().parent.parent
INSTALL_SCRIPT = ROOT / "scripts" / "install-snmp-tools.sh"


def ensure_net_snmp() -> None:
    """Install snmpd and snmpget with the project's script when they are missing."""
    if shutil.which("snmpd") and shutil.which("snmpget"):
        return
    if os.geteuid() != 0:
        raise RuntimeError(
            f"snmpd/snmpget are not installed and this is not root: run {INSTALL_SCRIPT} as root"
        )
    subprocess.run(["bash", str(INSTALL_SCRIPT)], check=True, stdin=subprocess.DEVNULL)


def override_lines(values: Mapping[OidTuple, Value]) -> list[str]:
    """snmpd.conf `override` lines serving these values."""
    lines = []
    for oid, value in sorted(values.items()):
        name = ".".join(map(str, oid))
        if isinstance(value, bool | int):
            lines.append(f"override {name} integer {int(value)}")
        elif isinstance(value, bytes | str):
            text = value.decode() if isinstance(value, bytes) else value
            lines.append(f'override {name} octet_str "{text}"')
        elif isinstance(value, tuple):
            lines.append(f"override {name} object_id {'.'.join(map(str, value))}")
    return lines


class NetSnmpd:
    """snmpd on 127.0.0.1:port with the given config lines (blocking start/stop)."""

    def __init__(self, config: Iterable[str], *, community: str = "public") -> None:
        self.config = list(config)
        self.community = community
        self.port = 0
        self._dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: BinaryIO | None = None

    def start(self, timeout_s: float = 20.0) -> None:
        """Write the config, start snmpd and wait until it answers."""
        ensure_net_snmp()
        self._dir = Path(tempfile.mkdtemp(prefix="rg-snmpd-"))
        conf = self._dir / "snmpd.conf"
        persist = self._dir / "persist"
        persist.mkdir()
        lines = [f"rocommunity {self.community} 127.0.0.1", *self.config]
        conf.write_text("\n".join(lines) + "\n")
        self.port = free_udp_port()
        # A log file, not a pipe: snmpd logs every request and would block on a full pipe.
        self._log = (self._dir / "snmpd.log").open("wb")
        self._proc = subprocess.Popen(
            [
                "snmpd", "-f", "-Lo", "-C", "-c", str(conf),
                f"--persistentDir={persist}", f"udp:127.0.0.1:{self.port}",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while snmp_get_blocking(self.port, self.community, "1.3.6.1.2.1.1.2.0") is None:
            code = self._proc.poll()
            if code is not None or time.monotonic() > deadline:
                log = self._dir / "snmpd.log"
                out = log.read_text(errors="replace") if log.exists() else ""
                self.stop()
                raise RuntimeError(f"snmpd did not start (exit {code}): {out[-2000:]}")

    @property
    def pid(self) -> int:
        """The snmpd process id."""
        assert self._proc is not None
        return self._proc.pid

    def stop(self) -> None:
        """Stop snmpd and remove its directory."""
        proc, self._proc = self._proc, None
        stop_process(proc)
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
