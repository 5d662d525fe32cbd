"""`rackguard probe` and `check-config` against SNMP devices served by snmpsim over UDP:
a device its profile reads nothing from exits 2 naming the profile and what it looked
for; `--all-profiles` says which profile reads what; check-config checks a reachable
device and says plainly when it could not."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from daemon.cli import main
from fakes.snmp_recording import SnmpsimServer, free_udp_port
from tests.support.secrets import write_secret

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "snmp"


@pytest.fixture(scope="module")
def snmpsim() -> Iterator[SnmpsimServer]:
    names = ["sentry4-no-evidence", "geist-v4", "sentry3-fahrenheit"]
    server = SnmpsimServer([FIXTURES / f"{n}.snmprec" for n in names])
    server.start()
    yield server
    server.stop()


def _config(tmp: Path, port: int, community: str, extra: str = "") -> Path:
    secret = tmp / f"{community}.community"
    write_secret(secret, f"{community}\n")
    path = tmp / "rackguard.toml"
    path.write_text(
        '[node]\nname = "n1"\n'
        f'[sources.pdu]\ntype = "snmp"\nhost = "127.0.0.1"\nport = {port}\n'
        f'community_file = "{secret}"\nrequest_timeout_s = 0.5\nretries = 0\n{extra}\n'
    )
    return path


def test_probe_of_a_device_its_profile_reads_nothing_from_exits_2(
    snmpsim: SnmpsimServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(tmp_path, snmpsim.port, "sentry4-no-evidence")
    assert main(["probe", "pdu", "--config", str(config)]) == 2
    out, err = capsys.readouterr()
    assert "inlet.A1.temperature" in out and "no probe fitted (sentinel -410)" in out
    assert "profile sentry4 (profiles/sentry4.toml) reads nothing rackguard uses" in err
    assert "looked for humidity, inlet_temperature, power" in err
    assert "rackguard probe pdu --all-profiles" in err


def test_probe_of_a_partly_read_device_exits_0_and_names_what_is_missing(
    snmpsim: SnmpsimServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(tmp_path, snmpsim.port, "sentry3-fahrenheit")
    assert main(["probe", "pdu", "--config", str(config)]) == 0
    _, err = capsys.readouterr()
    assert "pdu: not read from this device: power" in err


def test_probe_all_profiles_reports_which_profile_reads_what(
    snmpsim: SnmpsimServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(tmp_path, snmpsim.port, "geist-v4")
    assert main(["probe", "pdu", "--config", str(config), "--all-profiles", "--json"]) == 0
    out, err = capsys.readouterr()
    rows = {r["profile"]: r for r in json.loads(out)}
    assert "sysObjectID 1.3.6.1.4.1.21239.42.1.32" in err
    # Tried in the order probe and run try them: the longer match first.
    assert rows["vertiv-geist"]["candidate"] == 0 and rows["vertiv-geist"]["found"] == 0
    assert rows["geist-v4"]["candidate"] == 1
    assert rows["geist-v4"]["evidence"] == "humidity x1, inlet_temperature x1"
    assert rows["entity-sensor"]["matches"] == "fallback"
    assert rows["sentry4"]["candidate"] is None and rows["sentry4"]["evidence"] == "nothing"
    assert main(["probe", "pdu", "--config", str(config), "--all-profiles"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == [
        "TRY",
        "PROFILE",
        "MATCHES",
        "FOUND",
        "POLLED",
        "GOOD",
        "EVIDENCE",
        "READ",
    ]
    assert table[1].split()[:3] == ["1", "vertiv-geist", "yes"]


def test_probe_all_profiles_exits_2_when_no_profile_reads_anything(
    snmpsim: SnmpsimServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(tmp_path, snmpsim.port, "sentry4-no-evidence")
    assert main(["probe", "pdu", "--config", str(config), "--all-profiles"]) == 2
    assert "no profile reads anything rackguard uses" in capsys.readouterr().err


def test_check_config_refuses_a_reachable_device_its_profile_reads_nothing_from(
    snmpsim: SnmpsimServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(tmp_path, snmpsim.port, "sentry4-no-evidence")
    assert main(["check-config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "sources.pdu.profile: profile sentry4" in err and "reads nothing" in err


def test_check_config_says_when_a_device_was_not_checked(
    snmpsim: SnmpsimServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(tmp_path, snmpsim.port, "geist-v4")
    assert main(["check-config", str(config)]) == 0
    assert "sources.pdu: profile geist-v4 reads this device" in capsys.readouterr().err
    offline = _config(
        tmp_path, free_udp_port(), "geist-v4", "timeout_s = 1.0\npoll_deadline_s = 1.0"
    )
    assert main(["check-config", str(offline)]) == 0
    out, err = capsys.readouterr()
    assert "OK" in out
    assert "sources.pdu: device not reached, its profile not checked (offline)" in err


def test_probe_all_profiles_is_refused_for_a_source_that_is_not_snmp(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "rackguard.toml"
    path.write_text('[node]\nname = "n1"\n[sources.gpus]\ntype = "nvml"\n')
    assert main(["probe", "gpus", "--config", str(path), "--all-profiles"]) == 2
    assert "--all-profiles is for SNMP sources; 'gpus' is not one" in capsys.readouterr().err
