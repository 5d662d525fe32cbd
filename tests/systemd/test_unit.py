"""The shipped unit: systemd-analyze verify passes and the security exposure is as documented."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT

UNIT = ROOT / "systemd" / "rackguard.service"
DOC = ROOT / "docs" / "operations.md"
INSTALLED_EXEC = "/opt/rackguard/venv/bin/rackguard"


def analyze() -> str:
    path = shutil.which("systemd-analyze")
    if path is None:  # CI installs it (scripts/install-test-deps.sh); a bare clone may not
        pytest.fail("systemd-analyze not found: run scripts/install-test-deps.sh (Debian systemd)")
    return path


def test_unit_declares_what_the_daemon_relies_on() -> None:
    text = UNIT.read_text()
    for line in (
        "Type=notify",
        "WatchdogSec=",
        "Restart=on-failure",
        "RestartPreventExitStatus=2",  # a config error stays failed, not retried every 5 s
        "StateDirectory=rackguard",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "PrivateTmp=yes",
        "RestrictAddressFamilies=",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "DeviceAllow=/dev/nvidiactl rw",
        "MemoryMax=",
        "TasksMax=",
    ):
        assert line in text, line
    # The API's connection cap plus the daemon's own reserve fit in the limit.
    from daemon.config import ApiConfig  # noqa: PLC0415
    from daemon.service.listener import FD_RESERVE  # noqa: PLC0415

    (nofile,) = re.findall(r"^LimitNOFILE=(\d+)$", text, re.M)
    assert int(nofile) >= ApiConfig().max_connections + FD_RESERVE
    # Active: what the example config uses; the others are documented, commented out.
    assert re.findall(r"^LoadCredential=([\w.-]+):", text, re.M) == ["webhook.key"]
    creds = re.findall(r"^#?LoadCredential=([\w.-]+):", text, re.M)
    assert {"api.token", "slurm.jwt", "snmp-auth.key", "snmp-priv.key", "cdu-client.key"} <= set(
        creds
    )
    # Each with its blank default, so a missing file is named by the daemon (secrets.py).
    assert re.findall(r"^#?SetCredential=([\w.-]+):\\n$", text, re.M) == creds
    assert f"ExecStart={INSTALLED_EXEC} run --config " in text


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    # verify insists that ExecStart exists: point it at this checkout's console
    # script instead of the install path, and change nothing else.
    exe = Path(sys.executable).parent / "rackguard"
    assert exe.exists(), exe
    unit = tmp_path / "rackguard.service"
    unit.write_text(UNIT.read_text().replace(INSTALLED_EXEC, str(exe)))
    proc = subprocess.run(
        [analyze(), "verify", "--man=no", str(unit)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert "rackguard.service" not in proc.stderr, proc.stderr  # no warnings about the unit


def offline_score(unit: Path) -> float:
    """``systemd-analyze security --offline=true``'s overall exposure of a unit file."""
    proc = subprocess.run(
        [analyze(), "security", "--offline=true", str(unit)],
        capture_output=True,
        text=True,
        check=False,
    )
    m = re.search(rf"Overall exposure level for {re.escape(unit.name)}: ([\d.]+)", proc.stdout)
    assert m, proc.stdout[-2000:] + proc.stderr
    return float(m.group(1))


def test_systemd_analyze_security_rates_3_or_lower() -> None:
    # What docs/operations.md says of the file alone (the running unit's score is
    # checked under a real systemd: test_real_systemd.py).
    (claimed,) = re.findall(r"\(([\d.]+) for the file alone", DOC.read_text())
    assert offline_score(UNIT) <= float(claimed) <= 3.0
