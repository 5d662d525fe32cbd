"""check-config refuses whatever `run` would refuse, with exit 2 and the key; neither prints a
traceback for a configuration problem."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from daemon.cli import main
from daemon.service import preflight
from tests.support.daemon_harness import SIMULATED_RACKGUARD
from tests.support.paths import ROOT
from tests.support.wait import wait_until_sync


def write(tmp_path: Path, secret: Path, *, api: str = "", gpus: str = "", policy: str = "") -> Path:
    """A small valid config; each argument's lines go into its table."""
    cfg = tmp_path / "rg.toml"
    cfg.write_text(f"""
[node]
name = "n1"
[api]
port = 0
{api}
[sources.gpus]
type = "nvml"
{gpus}
[policy]
{policy}
[scheduler]
type = "webhook"
url = "http://127.0.0.1:9/none"
secret_file = "{secret}"
""")
    return cfg


def rackguard(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SIMULATED_RACKGUARD, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


CASES = {
    "record_max_mb inf": ({"policy": "record_max_mb = inf"}, "policy.record_max_mb"),
    "duration inf": ({"policy": "min_dwell_s = inf"}, "policy.min_dwell_s"),
    "duration nan": ({"policy": "resume_after_s = nan"}, "policy.resume_after_s"),
    "interval too short": ({"gpus": "interval_s = 0.001"}, "sources.gpus.interval_s"),
    "duplicate GPUs": ({"gpus": "gpus = [0, 1, 0]"}, "sources.gpus.gpus[2]"),
    "mistyped binding": ({"gpus": 'binding = "pynmvl"'}, "'pynmvl'"),
    "a module as binding": ({"gpus": 'binding = "fakes.nvml_module"'}, "sources.gpus.binding"),
    "not an address": ({"api": 'listen = "not an address!"'}, "api.listen"),
    "open address, no token": ({"api": 'listen = "0.0.0.0"'}, "api.listen"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_check_config_and_run_refuse_alike(case: str, tmp_path: Path, secret_file: Path) -> None:
    parts, key = CASES[case]
    cfg = write(tmp_path, secret_file, **parts)
    check = rackguard("check-config", str(cfg))
    assert check.returncode == 2, check.stdout + check.stderr
    assert key in check.stderr
    run = rackguard("run", "--config", str(cfg))
    assert run.returncode == 2, run.stderr
    assert key in run.stderr
    for out in (check, run):
        assert "Traceback" not in out.stderr, out.stderr


def test_a_port_in_use_is_refused_by_both(
    tmp_path: Path, secret_file: Path, busy_port: int
) -> None:
    cfg = write(tmp_path, secret_file)
    cfg.write_text(cfg.read_text().replace("port = 0", f"port = {busy_port}"))
    for args in (("check-config", str(cfg)), ("run", "--config", str(cfg))):
        proc = rackguard(*args)
        assert proc.returncode == 2, proc.stderr
        assert "api.port" in proc.stderr and str(busy_port) in proc.stderr
        assert "Traceback" not in proc.stderr


def test_a_missing_nvml_binding_is_refused_at_check_config(
    tmp_path: Path,
    secret_file: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The installed pynvml cannot be uninstalled for a test: ask for a module
    # that is not installed anywhere, as a node without nvidia-ml-py would.
    monkeypatch.setattr(preflight, "NVML_MODULE", "pynvml_not_installed_here")
    cfg = write(tmp_path, secret_file)
    assert main(["check-config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "sources.gpus.binding" in err and "nvidia-ml-py" in err


def test_non_utf8_config_is_exit_2_naming_the_file(tmp_path: Path, secret_file: Path) -> None:
    cfg = write(tmp_path, secret_file)
    cfg.write_bytes(b"# Temp\xe9rature du n\xbfud\n" + cfg.read_bytes())
    for args in (("check-config", str(cfg)), ("run", "--config", str(cfg))):
        proc = rackguard(*args)
        assert proc.returncode == 2, proc.stderr
        assert str(cfg) in proc.stderr and "not UTF-8" in proc.stderr and "line 1" in proc.stderr
        assert "Traceback" not in proc.stderr


def test_a_secret_readable_by_others_is_refused(tmp_path: Path, secret_file: Path) -> None:
    token = tmp_path / "api.token"
    token.write_text("t0ken\n")
    token.chmod(0o644)
    cfg = write(tmp_path, secret_file, api=f'token_file = "{token}"')
    proc = rackguard("check-config", str(cfg))
    assert proc.returncode == 2
    assert "api.token_file" in proc.stderr and "0644" in proc.stderr and "chmod 600" in proc.stderr
    token.chmod(0o600)
    assert rackguard("check-config", str(cfg)).returncode == 0


def test_an_open_address_with_opt_in_is_accepted(tmp_path: Path, secret_file: Path) -> None:
    cfg = write(tmp_path, secret_file, api='listen = "0.0.0.0"\nunauthenticated_reads = true')
    proc = rackguard("check-config", str(cfg))
    assert proc.returncode == 0, proc.stderr


def test_check_config_beside_the_running_agent_is_ok(tmp_path: Path, secret_file: Path) -> None:
    """The port held by rackguard itself (check-config before a restart) is no problem."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = write(tmp_path, secret_file)
    cfg.write_text(cfg.read_text().replace("port = 0", f"port = {port}"))
    log = tmp_path / "run.log"
    with log.open("wb") as out:
        agent = subprocess.Popen(
            [*SIMULATED_RACKGUARD, "run", "--config", str(cfg)], cwd=ROOT, stderr=out
        )
    try:
        wait_until_sync(lambda: "API on http://" in log.read_text(), 20, what="the agent's API")
        proc = rackguard("check-config", str(cfg))
        assert proc.returncode == 0, proc.stderr
    finally:
        agent.terminate()
        assert agent.wait(timeout=10) == 0
