"""The power-cap helper under a real systemd: socket activation, the peer check, its score.

The container is scripts/start-systemd-container.sh's (rackguard installed as
docs/operations.md says); these tests then install the helper with the block of
"## Power capping: the privileged helper", as written, and a drop-in that runs it
on the fake NVML (no GPU here; as root the fake lets it set limits, as NVML does).
Clients are transient units made by systemd-run: the daemon's user (DynamicUser
``rackguard``, in the daemon's sandbox) and others. Needs root, as CI is;
``pytest -k power_cap`` and ``-k real_systemd`` select these tests.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.paths import ROOT
from tests.support.systemd_container import Container
from tests.support.wait import wait_until_sync
from tests.systemd.test_real_systemd import doc_block

DOC = ROOT / "docs" / "operations.md"
HELPER = "rackguard-powercap.service"
SOCKET = "rackguard-powercap.socket"
SOCKET_PATH = "/run/rackguard/powercap.sock"
IDLE_EXIT_S = 3
SIMULATED = f"""# Tests only: the helper on the fake NVML of rackguard-sim (no GPU here).
[Service]
ExecStart=
ExecStart=/opt/rackguard/venv/bin/python -m fakes.nvml_module powercap-helper \\
  --allow-user rackguard --idle-exit-s {IDLE_EXIT_S}
Environment=PYTHONPATH=/opt/rackguard-sim RACKGUARD_FAKE_GPUS=2
"""
# The client: one request line, print the reply line.
ASK = (
    "import socket, sys\n"
    "s = socket.socket(socket.AF_UNIX)\n"
    f"s.connect({SOCKET_PATH!r})\n"
    "try:\n"
    "    s.sendall(sys.argv[1].encode() + b'\\n')\n"
    "except BrokenPipeError:\n"
    "    pass  # refused before reading: the answer is waiting\n"
    "print(s.makefile().readline(), end='')\n"
)
# The daemon's client class, from the node's own venv (no fakes there).
HELPER_CLIENT = (
    "import asyncio, pathlib, sys\n"
    "from adapters.sensors.power_limit import HelperClient\n"
    f"c = HelperClient(pathlib.Path({SOCKET_PATH!r}))\n"
    "after = asyncio.run(c.set_limit(sys.argv[1], float(sys.argv[2])))\n"
    "print(after.requested_w, after.enforced_w)\n"
)
# What rackguard.service's sandbox has that could stand between it and the socket.
DAEMON_SANDBOX = (
    "DynamicUser=yes",
    "User=rackguard",
    "ProtectSystem=strict",
    "ProtectHome=yes",
    "PrivateUsers=yes",
    "PrivateTmp=yes",
    "ProtectProc=invisible",
    "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6",
    "CapabilityBoundingSet=",
    "NoNewPrivileges=yes",
)


@pytest.fixture(scope="module")
def container(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Container]:
    ct = Container(tmp_path_factory.mktemp("systemd-container-power-cap"))
    try:
        ct.start()
        install = doc_block("## Power capping: the privileged helper")
        ct.write("/root/install/powercap.sh", install)
        ct.run("bash", "-eux", "/root/install/powercap.sh")
        ct.write(f"/etc/systemd/system/{HELPER}.d/50-simulated-node.conf", SIMULATED)
        ct.systemctl("daemon-reload")
        yield ct
    finally:
        ct.stop(purge=True)


def state(ct: Container, unit: str) -> str:
    return ct.systemctl("show", unit, "-p", "ActiveState", "--value").stdout.strip()


def as_unit(ct: Container, props: tuple[str, ...], code: str, *args: str) -> str:
    """Run python code in a transient unit with these properties; its stdout."""
    argv = ["systemd-run", "--wait", "--pipe", "--quiet", "--collect"]
    for p in props:
        argv += ["-p", p]
    argv += ["/opt/rackguard/venv/bin/python", "-c", code, *args]
    return ct.run(*argv, timeout=60).stdout


def ask(ct: Container, props: tuple[str, ...], request: dict[str, Any]) -> dict[str, Any]:
    reply: dict[str, Any] = json.loads(as_unit(ct, props, ASK, json.dumps(request)))
    return reply


def helper_journal(ct: Container) -> str:
    return ct.run("journalctl", "-u", HELPER, "-o", "cat", "--no-pager").stdout


def test_power_cap_real_systemd_installs_as_the_docs_say(container: Container) -> None:
    ct = container
    for unit in (SOCKET, HELPER):
        shipped = (ROOT / "systemd" / unit).read_text()
        assert ct.host_path(f"/etc/systemd/system/{unit}").read_text() == shipped
    assert ct.systemctl("is-enabled", SOCKET).stdout.strip() == "enabled"
    assert state(ct, SOCKET) == "active"
    assert ct.run("stat", "-c", "%a %U %F", SOCKET_PATH).stdout.split() == ["666", "root", "socket"]


def test_power_cap_real_systemd_socket_activation_serves_the_daemons_user(
    container: Container,
) -> None:
    ct = container
    wait_until_sync(lambda: state(ct, HELPER) == "inactive", timeout=30, what="helper idle")
    reply = ask(ct, DAEMON_SANDBOX, {"op": "limits"})
    assert reply["ok"] is True, reply
    assert [g["index"] for g in reply["limits"]] == [0, 1]
    assert reply["limits"][0]["default_w"] == 700.0
    assert state(ct, HELPER) == "active"  # started by the connection
    # It exits when idle, and the socket starts it again.
    wait_until_sync(
        lambda: state(ct, HELPER) == "inactive", timeout=IDLE_EXIT_S + 20, what="idle exit"
    )
    assert state(ct, SOCKET) == "active"
    assert ask(ct, DAEMON_SANDBOX, {"op": "limits"})["ok"] is True


def test_power_cap_real_systemd_sets_a_limit_and_journals_it(container: Container) -> None:
    ct = container
    uuid = ask(ct, DAEMON_SANDBOX, {"op": "limits"})["limits"][1]["uuid"]
    out = as_unit(ct, DAEMON_SANDBOX, HELPER_CLIENT, uuid, "350")
    assert out.split() == ["350.0", "350.0"]
    uid = re.search(r" uid (\d+) pid \d+ set GPU 1 \(" + re.escape(uuid), helper_journal(ct))
    assert uid, helper_journal(ct)[-2000:]
    assert 61184 <= int(uid.group(1)) <= 65519  # a DynamicUser's uid
    assert f"({uuid}) power limit 700 W -> 350 W" in helper_journal(ct)
    refused = ask(ct, DAEMON_SANDBOX, {"op": "set", "uuid": uuid, "watts": 900})
    assert refused == {
        "ok": False,
        "error": f"GPU {uuid}: 900 W is above its default limit 700 W"
        " (rackguard never raises a limit)",
        "permanent": True,
    }


@pytest.mark.parametrize(
    "props",
    [
        ("User=nobody",),
        ("DynamicUser=yes", "User=intruder"),
        ("User=root",),
    ],
    ids=["nobody", "another-dynamic-user", "root"],
)
def test_power_cap_real_systemd_refuses_other_uids(
    container: Container, props: tuple[str, ...]
) -> None:
    ct = container
    reply = ask(ct, props, {"op": "set", "uuid": "GPU-any", "watts": 300})
    assert reply["ok"] is False and "may not use this socket" in reply["error"], reply
    assert reply["permanent"] is True
    wait_until_sync(
        lambda: "refused connection from uid" in helper_journal(ct), timeout=10, what="journal"
    )


def test_power_cap_real_systemd_security_score_is_what_the_docs_claim(
    container: Container,
) -> None:
    (claimed,) = re.findall(
        r"`systemd-analyze security rackguard-powercap\.service` rates it\s+([\d.]+) ",
        DOC.read_text(),
    )
    out = container.run("systemd-analyze", "security", HELPER, "--no-pager").stdout
    m = re.search(r"Overall exposure level for rackguard-powercap\.service: ([\d.]+) (\w+)", out)
    assert m, out[-2000:]
    print(f"systemd-analyze security {HELPER}: {m.group(1)} {m.group(2)}")
    assert float(m.group(1)) <= float(claimed), out[-3000:]
    assert m.group(2) == "OK"
    offline = container.run(
        "systemd-analyze",
        "security",
        "--offline=true",
        "--no-pager",
        f"/etc/systemd/system/{HELPER}",
        check=False,
    ).stdout
    m = re.search(r"Overall exposure level for rackguard-powercap\.service: ([\d.]+)", offline)
    assert m and float(m.group(1)) <= float(claimed), offline[-3000:]


def test_power_cap_real_systemd_helper_has_only_cap_sys_admin(container: Container) -> None:
    ct = container
    assert ask(ct, DAEMON_SANDBOX, {"op": "limits"})["ok"] is True  # running now
    pid = ct.systemctl("show", HELPER, "-p", "MainPID", "--value").stdout.strip()
    status = ct.run("cat", f"/proc/{pid}/status").stdout
    m = re.search(r"^CapBnd:\s+([0-9a-f]+)$", status, re.M)
    assert m, status
    assert int(m.group(1), 16) == 1 << 21  # CAP_SYS_ADMIN alone
    assert re.search(r"^CapAmb:\s+0+$", status, re.M), status
