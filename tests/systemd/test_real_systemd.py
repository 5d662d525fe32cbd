"""The unit under a real systemd as PID 1 (a systemd-nspawn container of Debian 12).

scripts/start-systemd-container.sh boots the container and installs rackguard in
it with the install steps of docs/operations.md, run as written; each test then
drives the service through systemctl and journalctl, as an operator would. The
GPUs are simulated (the fake NVML of rackguard-sim, through a drop-in: no GPU
here); everything else is the shipped unit. Deliveries go to a webhook receiver
on the host's loopback, which the container shares.

Needs root (as CI is); `pytest -k real_systemd` selects these tests. The tests run
in file order on one container: the last ones restart and reboot it.
"""

from __future__ import annotations

import re
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fakes.scheduler import FakeWebhookScheduler
from tests.support.paths import ROOT
from tests.support.systemd_container import (
    CONFIG,
    DROP_INS,
    UNIT,
    Container,
    ThreadedReceiver,
)
from tests.support.wait import wait_until_sync

DOC = ROOT / "docs" / "operations.md"
SHIPPED_UNIT = ROOT / "systemd" / "rackguard.service"
EXAMPLE = ROOT / "systemd" / "rackguard.example.toml"
HOT_C = 86.0  # 4 °C under the simulated H100's slowdown: a drain
COOL_C = 41.0
# A drop-in of the tests' own, removed after each test.
TEST_DROP_IN = f"{DROP_INS}/90-test.conf"


def doc_block(heading: str) -> str:
    """The first ```sh block under a heading of docs/operations.md."""
    text = DOC.read_text()
    start = text.index(f"\n{heading}\n")
    m = re.search(r"^```sh\n(.*?)^```$", text[start:], re.S | re.M)
    assert m, f"no sh block under {heading!r}"
    return m.group(1)


@pytest.fixture(scope="module")
def container(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Container]:
    ct = Container(tmp_path_factory.mktemp("systemd-container"))
    try:
        yield ct.start()
    finally:
        ct.stop(purge=True)


@pytest.fixture
def receiver(container: Container) -> Iterator[FakeWebhookScheduler]:
    with ThreadedReceiver(container.webhook_key) as scheduler:
        yield scheduler


@pytest.fixture
def node(container: Container, receiver: FakeWebhookScheduler) -> Iterator[Container]:
    """The service on a fast config delivering to the receiver, with no outbox yet."""
    container.systemctl("stop", UNIT)
    container.run("rm", "-rf", "/var/lib/private/rackguard")  # what earlier tests decided
    container.heat(COOL_C)
    write_config(container, receiver.url)
    container.systemctl("start", UNIT)
    yield container
    container.remove(TEST_DROP_IN)
    container.systemctl("daemon-reload")


def write_config(ct: Container, url: str, extra: str = "", source: str = "gpus") -> None:
    ct.write(
        CONFIG,
        f"""
[node]
name = "gpu-node-ct"
rack = "rack-ct"
[api]
port = {ct.env["SYSTEMD_CT_API_PORT"]}
[sources.{source}]
type = "nvml"
interval_s = 0.2
timeout_s = 0.1
backoff_initial_s = 0.1
backoff_max_s = 0.5
[policy]
min_dwell_s = 0.0
resume_after_s = 0.5
stale_after_s = 2.0
evaluate_interval_s = 0.1
[scheduler]
type = "webhook"
url = "{url}"
secret_file = "/etc/rackguard/webhook.key"
timeout_s = 1.0
retry_initial_s = 0.2
retry_max_s = 0.5
{extra}
""",
    )


def restart(ct: Container) -> None:
    ct.systemctl("restart", UNIT)
    assert ct.show("ActiveState") == "active"


def drop_in(ct: Container, text: str) -> None:
    ct.write(TEST_DROP_IN, f"[Service]\n{text}\n")
    ct.systemctl("daemon-reload")


def pending(ct: Container) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = ct.get("/v1/outbox")["items"]
    return items


def decision_keys(ct: Container) -> list[str]:
    items = ct.get("/v1/decisions?kind=decision&limit=500")["items"]
    return [i["decision"]["key"] for i in items]


def one_pending_drain(ct: Container, receiver: FakeWebhookScheduler) -> str:
    """Heat the node while the receiver refuses: one drain waits in the outbox; its key."""
    receiver.fail_next, receiver.fail_status = 10**6, 503
    ct.heat(HOT_C)
    wait_until_sync(lambda: pending(ct), timeout=20, what="a pending decision")
    (item,) = pending(ct)
    assert item["decision"]["action"] == "drain", item
    key: str = item["decision"]["key"]
    return key


def delivered(receiver: FakeWebhookScheduler, key: str) -> bool:
    return any(r.key == key for r in receiver.received)


# ---------------------------------------------------------------------- install


def test_real_systemd_the_docs_install_steps_ran_as_written(container: Container) -> None:
    ran = Path(container.env["SYSTEMD_CT_INSTALL_SH"]).read_text()
    assert ran == doc_block("## Install on a GPU host")
    trace = Path(container.env["SYSTEMD_CT_INSTALL_LOG"]).read_text()
    commands = [line for line in trace.splitlines() if line.startswith("+ ")]
    assert commands[0] == "+ python3 -m venv /opt/rackguard/venv", trace
    assert commands[-1] == "+ systemctl enable --now rackguard", trace
    assert re.search(r"^rackguard 0\.1\.0 ", trace, re.M), trace
    assert "/etc/rackguard/rackguard.toml: OK (node gpu-node-01, 1 source(s))" in trace
    # What the steps left: the shipped unit and example config, the key private.
    ct = container
    assert ct.host_path("/etc/systemd/system/rackguard.service").read_text() == (
        SHIPPED_UNIT.read_text()
    )
    port = ct.env["SYSTEMD_CT_API_PORT"]
    assert ct.host_path(CONFIG).read_text() == EXAMPLE.read_text().replace(
        "\nport = 9470\n", f"\nport = {port}\n"
    )
    key = ct.run("stat", "-c", "%a %U", "/etc/rackguard/webhook.key").stdout.split()
    assert key == ["600", "root"]
    assert ct.host_path("/etc/rackguard/webhook.key").read_bytes() == ct.webhook_key
    assert ct.systemctl("is-enabled", UNIT).stdout.strip() == "enabled"
    # The node's venv holds no fakes; only the tests' drop-in adds them, beside it.
    probe = ct.run("/opt/rackguard/venv/bin/python", "-c", "import fakes", check=False)
    assert "No module named 'fakes'" in probe.stderr
    assert ct.show("ActiveState") == "active"


def test_real_systemd_security_score_is_what_the_docs_claim(container: Container) -> None:
    (claimed,) = re.findall(
        r"`systemd-analyze security rackguard\.service`\s+rates it ([\d.]+) ", DOC.read_text()
    )
    out = container.run("systemd-analyze", "security", UNIT, "--no-pager").stdout
    m = re.search(r"Overall exposure level for rackguard\.service: ([\d.]+) (\w+)", out)
    assert m, out[-2000:]
    assert float(m.group(1)) <= float(claimed), out[-2000:]
    assert m.group(2) == "OK"


# ---------------------------------------------------------------------- start


def test_real_systemd_start_is_active_only_after_ready(
    node: Container, receiver: FakeWebhookScheduler
) -> None:
    # A second source at a peer that accepts and never answers: its first connect
    # waits 5 s (FIRST_CONNECT_MIN_S), so READY=1 comes 5 s after the process is up.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        write_config(
            node,
            receiver.url,
            extra=f"""
[sources.cdu]
type = "opcua"
url = "opc.tcp://127.0.0.1:{port}"
root = "cdu:CDU-1"
namespaces = {{ cdu = "urn:test:cdu" }}
""",
        )
        cursor = node.cursor()
        node.systemctl("restart", "--no-block", UNIT)
        seen: list[tuple[str, bool]] = []

        def state() -> str:
            active = node.show("ActiveState")
            try:
                healthy = node.get("/healthz")["status"] == "ok"
            except OSError:
                healthy = False
            seen.append((active, healthy))
            return active

        wait_until_sync(lambda: state() == "active", timeout=30, what="active", interval=0.2)
    # The process served /healthz while systemd still said "activating".
    assert ("activating", True) in seen, seen
    lines = node.journal(cursor)
    ready = next(i for i, line in enumerate(lines) if ": ready: " in line)
    started = next(i for i, line in enumerate(lines) if line.startswith("Started rackguard"))
    assert ready < started, lines
    # STATUS= from the daemon: `systemctl status` says what it watches.
    assert node.show("StatusText").startswith("gpu-node-ct (SIMULATED GPUs): "), node.show(
        "StatusText"
    )


def test_real_systemd_a_config_error_keeps_it_failed_naming_the_key(
    node: Container, receiver: FakeWebhookScheduler
) -> None:
    write_config(node, receiver.url, extra="[logging]\nlevel = 'loud'\n")
    cursor = node.cursor()
    assert node.systemctl("restart", UNIT, check=False).returncode != 0
    # Not "activating (auto-restart)", which Restart=on-failure alone would give at
    # once, and again every RestartSec=5s: RestartPreventExitStatus=2.
    assert (node.show("ActiveState"), node.show("SubState")) == ("failed", "failed")
    assert node.show("ExecMainStatus") == "2"
    lines = node.journal(cursor)
    assert any(line.strip().startswith("logging.level:") for line in lines), lines
    assert not any("Traceback" in line for line in lines), lines


# ---------------------------------------------------------------------- credentials


def test_real_systemd_the_secret_comes_through_load_credential(
    node: Container, receiver: FakeWebhookScheduler
) -> None:
    pid = node.main_pid()
    environ = node.run("cat", f"/proc/{pid}/environ").stdout.split("\0")
    env = dict(v.split("=", 1) for v in environ if "=" in v)
    assert env["CREDENTIALS_DIRECTORY"] == "/run/credentials/rackguard.service"
    # The dynamic user cannot read the root-only original; it signs with the copy.
    uid = node.run("stat", "-c", "%u", f"/proc/{pid}").stdout.strip()
    assert int(uid) >= 61184  # systemd's dynamic user range
    node.heat(HOT_C)
    wait_until_sync(lambda: receiver.received, timeout=20, what="a signed delivery")
    assert receiver.rejected_signatures == 0


def test_real_systemd_a_missing_credential_fails_the_start_with_a_clear_line(
    node: Container, receiver: FakeWebhookScheduler
) -> None:
    key = node.host_path("/etc/rackguard/webhook.key")
    aside = node.host_path("/root/webhook.key.aside")
    key.rename(aside)
    try:
        cursor = node.cursor()
        assert node.systemctl("restart", UNIT, check=False).returncode != 0
        assert node.show("ActiveState") == "failed"
        lines = node.journal(cursor)
        clear = (
            "scheduler.secret_file: secret file '/etc/rackguard/webhook.key' cannot be read:"
            " No such file or directory"
        )
        assert any(line.strip() == clear for line in lines), lines
        assert not any("Protocol error" in line for line in lines), lines
    finally:
        aside.rename(key)
    restart(node)


# ---------------------------------------------------------------------- reload


def test_real_systemd_reload_applies_a_new_config_and_keeps_it_on_a_bad_one(
    node: Container, receiver: FakeWebhookScheduler
) -> None:
    pid = node.main_pid()
    write_config(node, receiver.url, source="gpus-renamed")
    cursor = node.cursor()
    node.systemctl("reload", UNIT)
    wait_until_sync(
        lambda: "gpus-renamed" in node.get("/v1/state")["sources"], timeout=20, what="reloaded"
    )
    assert node.main_pid() == pid
    assert any(
        "configuration reloaded from /etc/rackguard/rackguard.toml" in s
        for s in node.journal(cursor)
    )
    # A file that is not TOML: refused in one record, the running config kept.
    node.write(CONFIG, "[node\nname = ")
    cursor = node.cursor()
    node.systemctl("reload", UNIT)
    wait_until_sync(
        lambda: any("refused" in s for s in node.journal(cursor)), timeout=20, what="the refusal"
    )
    wait_until_sync(lambda: node.show("ActiveState") == "active", timeout=10, what="active")
    refusals = [s for s in node.journal(cursor) if "reload of" in s]
    assert len(refusals) == 1, refusals
    assert refusals[0].startswith(
        "daemon.service.reloader: reload of /etc/rackguard/rackguard.toml refused, keeping"
    ), refusals
    assert list(node.get("/v1/state")["sources"]) == ["gpus-renamed"]
    assert node.main_pid() == pid


# ---------------------------------------------------------------------- watchdog


def test_real_systemd_a_hung_loop_is_restarted_by_the_watchdog_and_delivers_after(
    node: Container, receiver: FakeWebhookScheduler
) -> None:
    # The shipped WatchdogSec=30s, shortened: the same mechanism, a shorter wait.
    drop_in(node, "WatchdogSec=3s")
    restart(node)
    key = one_pending_drain(node, receiver)
    pid, restarts = node.main_pid(), int(node.show("NRestarts"))
    cursor = node.cursor()
    node.run("kill", "-STOP", str(pid))  # the whole process hangs, event loop and all
    wait_until_sync(
        lambda: int(node.show("NRestarts")) > restarts and node.show("ActiveState") == "active",
        timeout=60,
        what="restarted by the watchdog",
        interval=0.5,
    )
    assert node.main_pid() != pid
    assert any("Watchdog timeout" in line for line in node.journal(cursor))
    assert not delivered(receiver, key)
    receiver.fail_next = 0  # the scheduler is back: the pending drain goes out now
    wait_until_sync(lambda: delivered(receiver, key), timeout=20, what="pending drain delivered")
    wait_until_sync(lambda: not pending(node), timeout=10, what="outbox empty")


# ---------------------------------------------------------------------- stop


def test_real_systemd_stop_is_graceful_and_keeps_what_is_undelivered(
    node: Container, receiver: FakeWebhookScheduler
) -> None:
    key = one_pending_drain(node, receiver)
    cursor = node.cursor()
    t0 = time.monotonic()
    node.systemctl("stop", UNIT)
    took = time.monotonic() - t0
    assert took < 10, took  # TimeoutStopSec=10s
    assert node.show("Result") == "success"
    lines = node.journal(cursor)
    assert any("stopping with 1 undelivered decision(s): gpu-node-ct drain" in s for s in lines)
    assert any(s.endswith("gpu-node-ct: stopped") for s in lines), lines
    receiver.fail_next = 0
    node.systemctl("start", UNIT)
    wait_until_sync(lambda: delivered(receiver, key), timeout=20, what="delivered after start")


# ---------------------------------------------------------------------- state, sandbox


def test_real_systemd_nothing_is_written_outside_the_state_directory(
    node: Container, receiver: FakeWebhookScheduler
) -> None:
    node.heat(HOT_C)
    wait_until_sync(lambda: receiver.received, timeout=20, what="a delivery")
    pid = node.main_pid()
    uid = node.run("stat", "-c", "%u", f"/proc/{pid}").stdout.strip()
    # Everything the dynamic user owns on the container's disks: its state directory.
    found = node.run("find", "/", "-xdev", "-uid", uid, check=False).stdout.split()
    assert found, "nothing owned by the service's user"
    assert all(p.startswith("/var/lib/private/rackguard") for p in found), found
    assert "/var/lib/private/rackguard/outbox.sqlite3" in found
    assert node.run("readlink", "/var/lib/rackguard").stdout.strip() == "private/rackguard"

    # In the service's own mount namespace even root cannot write outside the state
    # directory: the file system is read-only there (ProtectSystem=strict), the
    # homes hidden (ProtectHome=yes). The service's user writes its state.
    def write_in_service(path: str, *user: str) -> subprocess.CompletedProcess[str]:
        nsenter = ["nsenter", "-t", str(pid), "-m", *user]
        return node.run(*nsenter, "sh", "-c", f"echo x > {path}", check=False)

    for path in ("/etc/rackguard/probe", "/opt/rackguard/probe", "/usr/probe", "/var/lib/probe"):
        res = write_in_service(path)
        assert "Read-only file system" in res.stderr, (path, res.returncode, res.stderr)
        assert node.run("test", "-e", path, check=False).returncode != 0, path
    assert write_in_service("/root/probe").returncode != 0
    assert write_in_service("/var/lib/rackguard/probe", "-S", uid, "-G", uid).returncode == 0
    node.run("rm", "/var/lib/private/rackguard/probe")


def test_real_systemd_the_outbox_survives_restart_and_reboot(
    node: Container, receiver: FakeWebhookScheduler
) -> None:
    node.heat(HOT_C)
    wait_until_sync(lambda: receiver.received, timeout=20, what="a delivery")
    keys = decision_keys(node)
    assert keys
    node.systemctl("restart", UNIT)
    assert set(keys) <= set(decision_keys(node))
    node.stop()  # power off: systemd stops the service, the container exits
    node.start()
    assert node.env["SYSTEMD_CT_BOOTED"] == "rebooted", node.start_stderr
    wait_until_sync(lambda: node.show("ActiveState") == "active", timeout=30, what="up at boot")
    wait_until_sync(lambda: _answers(node), timeout=20, what="API")
    assert set(keys) <= set(decision_keys(node))


def _answers(ct: Container) -> bool:
    try:
        ct.get("/healthz")
    except OSError:
        return False
    return True
