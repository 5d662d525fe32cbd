"""The [sources.NAME] table for OPC-UA: defaults, cross-field checks, the adapter it builds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from adapters.sensors.opcua import OpcuaAdapter
from daemon.config.opcua import OpcuaSourceConfig
from daemon.config.typed_toml import ConfigError, load_typed
from daemon.service.sources import build_opcua_adapter
from tests.support.secrets import write_secret

URL = "opc.tcp://cdu-1.example:4840"


def load(**kw: Any) -> OpcuaSourceConfig:
    return load_typed(OpcuaSourceConfig, {"type": "opcua", "url": URL, **kw})


def problems(**kw: Any) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load(**kw)
    return info.value.problems


def test_defaults_are_valid_and_build_a_subscribing_adapter() -> None:
    cfg = load()
    assert cfg.timing.interval_s == 1.0
    assert cfg.timing.timeout_s < cfg.timing.interval_s
    adapter = build_opcua_adapter("cdu", cfg)
    assert isinstance(adapter, OpcuaAdapter)
    assert adapter.name == "cdu"
    assert adapter.url == URL
    assert adapter.settings.mode == "subscription"
    assert adapter.settings.profile.name == "generic"
    assert adapter.settings.session.security.policy == "None"
    assert adapter.settings.session.password is None


@pytest.mark.parametrize(
    ("overrides", "key", "text"),
    [
        ({"timeout_s": 1.0}, "timeout_s", "must be less than interval_s"),
        ({"backoff_max_s": 0.5}, "backoff_max_s", "must be at least backoff_initial_s"),
        ({"url": "http://cdu:4840"}, "url", "opc.tcp://"),
        ({"stale_after_s": 5.0}, "stale_after_s", "more than keepalive_s"),
        ({"bad_after_s": 10.0}, "bad_after_s", "more than stale_after_s"),
        (
            {"profile": "nope"},
            "profile",
            "unknown CDU profile 'nope' (known: generic, opc40082-tcd)",
        ),
        ({"nodes": {"flux": "ns=2;i=7"}}, "nodes.flux", "not a variable of profile"),
        ({"variables": ["flow", "humidity"]}, "variables", "'humidity' is not a variable"),
        ({"root": "vendor:CDU"}, "root", "alias 'vendor' is not declared"),
        ({"security_policy": "Basic256Sha256"}, "security_mode", "must be Sign or SignAndEncrypt"),
        ({"security_mode": "Sign"}, "security_mode", "None without one"),
        ({"username": "op"}, "password_file", "is required with username"),
        ({"mode": "push"}, "mode", "must be one of"),
        ({"sampling_interval_s": 0}, "sampling_interval_s", "greater than 0"),
    ],
)
def test_problems_name_the_key(overrides: dict[str, Any], key: str, text: str) -> None:
    found = [p for p in problems(**overrides) if p.startswith(f"{key}:")]
    assert found, problems(**overrides)
    assert text in found[0]


def test_secure_policy_needs_the_certificate_files(tmp_path: Path) -> None:
    got = problems(
        security_policy="Basic256Sha256",
        security_mode="SignAndEncrypt",
        certificate_file=str(tmp_path / "missing.pem"),
    )
    assert any(p.startswith("certificate_file:") and "cannot be read" in p for p in got)
    assert any(p.startswith("private_key_file:") and "is required" in p for p in got)
    assert any(p.startswith("server_certificate_file:") and "is required" in p for p in got)


def test_password_file_must_be_readable_and_not_empty(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    write_secret(empty, "\n")
    got = problems(username="op", password_file=str(empty))
    assert any(p.startswith("password_file:") and "is empty" in p for p in got)


def test_node_ids_namespaces_and_subset_reach_the_adapter(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    write_secret(secret, "s3cret\n")
    cfg = load(
        profile="opc40082-tcd",
        mode="poll",
        root="nsu=urn:vendor:cdu;s=TCD",
        nodes={"flow": "ns=3;i=1001"},
        namespaces={"cdu": "urn:vendor:cdu"},
        variables=["flow", "supply_temperature"],
        username="op",
        password_file=str(secret),
        deadband=0.1,
    )
    s = build_opcua_adapter("cdu", cfg).settings
    assert s.profile.name == "opc40082-tcd"
    assert s.mode == "poll"
    assert s.root == "nsu=urn:vendor:cdu;s=TCD"
    assert dict(s.nodes) == {"flow": "ns=3;i=1001"}
    assert s.variables == ("flow", "supply_temperature")
    assert s.deadband == 0.1
    assert s.session.username == "op"
    assert s.session.password is not None
    assert s.session.password() == "s3cret"  # read from the file, newline stripped


def test_site_overrides_reach_the_adapter_and_typos_name_their_key() -> None:
    # The TCD model has no leak sensor: nodes.leak adds the standard variable.
    units = {"flow": "cubic_meters_per_hour"}
    cfg = load(profile="opc40082-tcd", nodes={"leak": "ns=2;s=Leak"}, units=units)
    profile = build_opcua_adapter("cdu", cfg).settings.profile
    leak = profile.variable("leak")
    assert leak.kind.value == "leak"
    assert profile.variable("flow").unit.name == "cubic_meters_per_hour"
    assert any(p.startswith("units.flow:") for p in problems(units={"flow": "parsec"}))
    assert any(p.startswith("paths.flow:") for p in problems(paths={"flow": "NoAlias"}))
    assert any(p.startswith("units.pump_speed:") for p in problems(units={"pump_speed": "bar"}))
    found = problems(paths={"flow": "vendor:Flow"})
    assert any(p.startswith("paths.flow:") and "'vendor' is not declared" in p for p in found)


def test_the_private_key_may_be_a_systemd_credential(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("client.der", "server.der"):
        (tmp_path / name).write_bytes(b"x")
    creds = tmp_path / "credentials"
    creds.mkdir()
    write_secret(creds / "cdu-client.key", "-----BEGIN PRIVATE KEY-----\n")
    secure = {
        "security_policy": "Basic256Sha256",
        "security_mode": "SignAndEncrypt",
        "certificate_file": str(tmp_path / "client.der"),
        "private_key_file": "cdu-client.key",
        "server_certificate_file": str(tmp_path / "server.der"),
    }
    assert any(p.startswith("private_key_file:") for p in problems(**secure))
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))
    cfg = load(**secure)
    key = build_opcua_adapter("cdu", cfg).settings.session.security.private_key
    assert key == creds / "cdu-client.key"
