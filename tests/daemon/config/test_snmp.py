"""[sources.NAME] type = "snmp": defaults, cross-field checks and secrets, each error by key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from adapters.errors import SourceSetupError
from adapters.sensors.snmp import SnmpAdapter
from adapters.sensors.snmp_client import V2cClient, V3Client
from daemon.config.snmp import SnmpSourceConfig
from daemon.config.typed_toml import ConfigError, load_typed
from daemon.service.sources import build_snmp_adapter, snmp_client
from tests.support.secrets import write_secret


def _load(**fields: Any) -> SnmpSourceConfig:
    return load_typed(SnmpSourceConfig, {"type": "snmp", "host": "pdu-a1", **fields})


@pytest.fixture
def community(tmp_path: Path) -> Path:
    path = tmp_path / "community"
    write_secret(path, "s3cret-community\n")
    return path


def test_v2c_defaults_and_builder(community: Path) -> None:
    cfg = _load(community_file=str(community), probe_positions={"A1": "bottom"})
    assert cfg.version == "2c" and cfg.port == 161 and cfg.max_varbinds == 16
    assert cfg.timing.timeout_s == cfg.timeout_s < cfg.interval_s
    assert cfg.poll_deadline_s <= cfg.timeout_s
    client = snmp_client(cfg)
    assert isinstance(client, V2cClient) and client.target == "pdu-a1:161"
    adapter = build_snmp_adapter("rack1-pdu-a", cfg)
    assert isinstance(adapter, SnmpAdapter) and adapter.name == "rack1-pdu-a"


def _problems(**fields: Any) -> list[str]:
    with pytest.raises(ConfigError) as err:
        _load(**fields)
    return err.value.problems


def test_v2c_needs_a_readable_community_file(tmp_path: Path) -> None:
    assert _problems() == ["community_file: required with version = '2c'"]
    empty = tmp_path / "empty"
    write_secret(empty, "\n")
    (problem,) = _problems(community_file=str(empty))
    assert problem.startswith("community_file: secret file") and "is empty" in problem


def test_v3_needs_user_and_key_files(tmp_path: Path, community: Path) -> None:
    problems = _problems(version="3")
    assert "user: required with version = '3'" in problems
    assert "auth_key_file: required with version = '3'" in problems
    assert "priv_key_file: required with priv_protocol = 'aes'" in problems
    key = tmp_path / "key"
    write_secret(key, "a-long-enough-key\n")
    cfg = _load(version="3", user="rg", auth_key_file=str(key), priv_protocol="none")
    assert isinstance(snmp_client(cfg), V3Client)
    mixed = _problems(
        version="3", user="rg", auth_key_file=str(key), priv_key_file=str(key),
        priv_protocol="none", community_file=str(community),
    )  # fmt: skip
    assert "priv_key_file: is not used with priv_protocol = 'none'" in mixed
    assert "community_file: is only used with version = '2c'" in mixed


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"timeout_s": 20.0}, "timeout_s: must be less than interval_s (10.0), got 20.0"),
        ({"poll_deadline_s": 6.0}, "poll_deadline_s: must be at most timeout_s (5.0), got 6.0"),
        ({"max_varbinds": 0}, "max_varbinds: must be at least 1, got 0"),
        ({"version": "1"}, "version: must be one of '2c', '3', got string '1'"),
        ({"priv_protocol": "des"}, "priv_protocol: must be one of"),
        ({"host": " "}, "host: must name the device"),
        ({"probe_positions": {"A1": ""}}, "probe_positions.A1: must name a position"),
        ({"community": "public"}, "community: unknown key"),
    ],
)
def test_problems_name_the_key(community: Path, fields: dict[str, Any], expected: str) -> None:
    problems = _problems(community_file=str(community), **fields)
    assert any(p.startswith(expected) for p in problems), problems


def test_a_vanished_secret_is_a_setup_error(community: Path) -> None:
    cfg = _load(community_file=str(community))
    community.unlink()
    with pytest.raises(SourceSetupError, match="community_file"):
        build_snmp_adapter("pdu", cfg)
