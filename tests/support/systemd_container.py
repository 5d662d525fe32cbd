"""A Debian 12 machine with systemd as PID 1, rackguard installed as docs/operations.md says.

scripts/start-systemd-container.sh boots it (systemd-nspawn) and installs the agent;
the tests drive it from the host as an operator would, through ``systemctl`` and
``journalctl`` run inside it (``nsenter``), and read the daemon's API on the
loopback the container shares with the host.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import threading
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fakes.scheduler import FakeWebhookScheduler
from tests.support.paths import ROOT

START = ROOT / "scripts" / "start-systemd-container.sh"
STOP = ROOT / "scripts" / "stop-systemd-container.sh"
UNIT = "rackguard"
CONFIG = "/etc/rackguard/rackguard.toml"
DROP_INS = "/etc/systemd/system/rackguard.service.d"
# The fake NVML's temperature file (scripts/start-systemd-container.sh's drop-in).
TEMPERATURE = "/run/rackguard-sim/temperature"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def run_script(script: Path, directory: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run one of the container scripts; AssertionError with its stderr when it fails."""
    proc = subprocess.run(
        [str(script), str(directory)],
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
        env={**os.environ, "SYSTEMD_CT_PYTHON": sys.executable, **env},
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, f"{script.name} failed:\n{proc.stderr[-4000:]}"
    return proc


def parse_env(stdout: str) -> dict[str, str]:
    """The KEY=VALUE lines a start script printed."""
    return dict(line.split("=", 1) for line in stdout.splitlines() if "=" in line)


@dataclass
class Container:
    """The booted container; ``pid`` is its systemd as the host sees it."""

    dir: Path
    env: dict[str, str] = field(default_factory=dict)
    start_stderr: str = ""

    @property
    def pid(self) -> int:
        return int(self.env["SYSTEMD_CT_PID"])

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.env['SYSTEMD_CT_API_PORT']}"

    @property
    def webhook_key(self) -> bytes:
        return Path(self.env["SYSTEMD_CT_WEBHOOK_KEY_FILE"]).read_bytes()

    def start(self) -> Container:
        """Run the start script (fresh, reboot or already running, as it decides)."""
        proc = run_script(START, self.dir)
        self.env = parse_env(proc.stdout)
        self.start_stderr = proc.stderr
        return self

    def stop(self, *, purge: bool = False) -> None:
        """Power the container off (its state kept in its directory unless ``purge``)."""
        run_script(STOP, self.dir, SYSTEMD_CT_PURGE="1" if purge else "0")

    # ---- inside the container

    def run(
        self, *argv: str, check: bool = True, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        """Run a command in the container, with its own environment, not the host's."""
        proc = subprocess.run(
            [
                "nsenter",
                "-t",
                str(self.pid),
                "-a",
                "env",
                "-i",
                f"PATH={PATH}",
                "LANG=C.UTF-8",
                *argv,
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        if check:
            assert proc.returncode == 0, f"{argv} exited {proc.returncode}: {proc.stderr[-2000:]}"
        return proc

    def systemctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run("systemctl", *args, check=check)

    def show(self, prop: str) -> str:
        """One property of the unit, as ``systemctl show`` gives it."""
        return self.systemctl("show", UNIT, "-p", prop, "--value").stdout.strip()

    def main_pid(self) -> int:
        """The daemon's PID inside the container (0 when none)."""
        return int(self.show("MainPID"))

    def cursor(self) -> str:
        """The journal's current end: pass it to journal() to read only what follows."""
        out = self.run("journalctl", "-n", "0", "--show-cursor", "-q").stdout
        m = re.search(r"^-- cursor: (\S+)$", out, re.M)
        if m is None:  # an empty journal has no cursor yet
            return ""
        return m.group(1)

    def journal(self, after: str = "") -> list[str]:
        """The unit's journal messages (the daemon's and systemd's about it) after ``after``."""
        args = ["journalctl", "-u", UNIT, "-o", "cat", "--no-pager"]
        if after:
            args.append(f"--after-cursor={after}")
        return self.run(*args).stdout.splitlines()

    def host_path(self, inside: str) -> Path:
        """A path of the container as the host reaches it (through its PID 1's root)."""
        return Path(f"/proc/{self.pid}/root") / inside.lstrip("/")

    def write(self, inside: str, text: str | bytes, mode: int = 0o644) -> None:
        path = self.host_path(inside)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = text.encode() if isinstance(text, str) else text
        tmp = path.with_name(path.name + ".new")
        tmp.write_bytes(data)
        tmp.chmod(mode)
        tmp.replace(path)

    def remove(self, inside: str) -> None:
        self.host_path(inside).unlink(missing_ok=True)

    def heat(self, celsius: float) -> None:
        """Every simulated GPU's temperature (the fake NVML re-reads it every 50 ms)."""
        self.write(TEMPERATURE, f"{celsius}\n")

    # ---- the daemon's API, on the shared loopback

    def get(self, path: str) -> Any:
        """GET an API path; JSON decoded, text otherwise."""
        with urllib.request.urlopen(self.api + path, timeout=5) as resp:
            body = resp.read().decode()
            if resp.headers.get_content_type() == "application/json":
                return json.loads(body)
            return body

    def metric(self, name: str) -> float:
        """The sum of a metric's samples (0 when absent)."""
        text = self.get("/metrics")
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(name) and not line.startswith("#")
        )


class ThreadedReceiver:
    """The fake webhook scheduler on the host's loopback, served by a thread of its own.

    The tests block on nsenter and systemctl; the receiver keeps answering meanwhile.
    """

    def __init__(self, secret: bytes) -> None:
        self.scheduler = FakeWebhookScheduler(secret)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="receiver")
        self.url = ""

    def __enter__(self) -> FakeWebhookScheduler:
        self._thread.start()
        self.url = asyncio.run_coroutine_threadsafe(self.scheduler.start(), self._loop).result(10)
        return self.scheduler

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.scheduler.stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
