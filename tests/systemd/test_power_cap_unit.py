"""The shipped power-cap helper units: systemd-analyze verify passes, the score is as documented."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from daemon.config.power_cap import DEFAULT_HELPER_SOCKET
from tests.support.paths import ROOT
from tests.systemd.test_unit import INSTALLED_EXEC, analyze, offline_score

SERVICE = ROOT / "systemd" / "rackguard-powercap.service"
SOCKET = ROOT / "systemd" / "rackguard-powercap.socket"
DOC = ROOT / "docs" / "operations.md"


def test_power_cap_units_declare_the_narrow_path() -> None:
    service = SERVICE.read_text()
    for line in (
        f"ExecStart={INSTALLED_EXEC} powercap-helper --allow-user rackguard ",
        "Requires=rackguard-powercap.socket",
        "CapabilityBoundingSet=CAP_SYS_ADMIN\n",
        "AmbientCapabilities=\n",
        "NoNewPrivileges=yes",
        "PrivateNetwork=yes",
        "RestrictAddressFamilies=AF_UNIX\n",
        "IPAddressDeny=any",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "DevicePolicy=closed",
        "DeviceAllow=/dev/nvidiactl rw",
        "DeviceAllow=char-nvidia-frontend rw",
        "SystemCallFilter=@system-service",
    ):
        assert line in service, line
    assert "PrivateUsers=yes" not in service  # it would hide CAP_SYS_ADMIN from the driver
    assert not re.search(r"^(ReadWritePaths|StateDirectory|RuntimeDirectory)=", service, re.M)
    socket = SOCKET.read_text()
    assert f"ListenStream={DEFAULT_HELPER_SOCKET}\n" in socket
    assert "Accept=no" in socket


def test_power_cap_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    exe = Path(sys.executable).parent / "rackguard"
    assert exe.exists(), exe
    (tmp_path / SOCKET.name).write_text(SOCKET.read_text())
    unit = tmp_path / SERVICE.name
    unit.write_text(SERVICE.read_text().replace(INSTALLED_EXEC, str(exe)))
    proc = subprocess.run(
        [analyze(), "verify", "--man=no", str(unit), str(tmp_path / SOCKET.name)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "rackguard-powercap" not in proc.stderr, proc.stderr


def test_power_cap_helper_security_score_is_what_the_docs_claim() -> None:
    (claimed,) = re.findall(
        r"`systemd-analyze security rackguard-powercap\.service` rates it\s+([\d.]+) ",
        DOC.read_text(),
    )
    assert offline_score(SERVICE) <= float(claimed) <= 3.0
