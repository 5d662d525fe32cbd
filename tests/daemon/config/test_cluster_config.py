"""The [cluster] table: check-config refuses what run would, naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon.cli import main
from daemon.config import ConfigError, parse_config

BASE = """
[node]
name = "gpu01"
[sources.gpus]
type = "nvml"
"""


def test_defaults_are_the_scheduler_view_without_etcd() -> None:
    c = parse_config(BASE).cluster
    assert c.view_interval_s == 10.0 and c.etcd == [] and c.etcd_prefix == "/rackguard/"


@pytest.mark.parametrize(
    ("table", "key"),
    [
        ('etcd = ["10.0.0.1:2379"]', "cluster.etcd[0]"),
        ('etcd_prefix = "rackguard"', "cluster.etcd_prefix"),
        ("lease_ttl_s = 1", "cluster.lease_ttl_s"),
        ("lease_ttl_s = 3\nclaim_timeout_s = 5.0", "cluster.claim_timeout_s"),
        ('racks = { a = ["gpu01"], b = ["gpu01"] }', "cluster.racks.b"),
        ("view_interval_s = -1", "cluster.view_interval_s"),
        ("etcd = 5", "cluster.etcd"),
        # Plain HTTP to another machine: anyone on the path could claim slots.
        ('etcd = ["http://10.0.0.1:2379"]', "cluster.etcd[0]"),
        ('etcd = ["http://127.0.0.1:2379", "http://etcd2:2379"]', "cluster.etcd[1]"),
        ('etcd = ["https://10.0.0.1:2379"]\netcd_cert_file = "/nonexistent.pem"', "cluster.etcd_"),
        ('etcd = ["https://10.0.0.1:2379"]\netcd_user = "rackguard"', "cluster.etcd_password_file"),
        ('etcd = ["http://127.0.0.1:2379"]\netcd_ca_file = "/etc/hostname"', "cluster.etcd"),
    ],
)
def test_bad_cluster_settings_are_refused_by_name(table: str, key: str, tmp_path: Path) -> None:
    text = BASE + "[cluster]\n" + table + "\n"
    with pytest.raises(ConfigError) as err:
        parse_config(text)
    assert any(p.startswith(key) for p in err.value.problems), err.value.problems
    path = tmp_path / "rg.toml"
    path.write_text(text)
    assert main(["check-config", str(path)]) == 2


def test_plain_http_off_loopback_needs_an_explicit_insecure(tmp_path: Path) -> None:
    text = BASE + '[cluster]\netcd = ["http://10.0.0.1:2379"]\n'
    with pytest.raises(ConfigError) as err:
        parse_config(text)
    (problem,) = err.value.problems
    assert "etcd_insecure = true" in problem and "https://" in problem, problem
    c = parse_config(text + "etcd_insecure = true\n").cluster
    assert c.etcd_insecure and c.etcd == ["http://10.0.0.1:2379"]
    assert parse_config(BASE + '[cluster]\netcd = ["http://localhost:2379"]\n').cluster.etcd


def test_a_readable_etcd_key_is_refused_like_any_secret(tmp_path: Path) -> None:
    cert = tmp_path / "client.pem"
    cert.write_text("-----BEGIN CERTIFICATE-----\n")
    key = tmp_path / "client.key"
    key.write_text("-----BEGIN PRIVATE KEY-----\n")
    key.chmod(0o644)
    text = BASE + (
        f'[cluster]\netcd = ["https://10.0.0.1:2379"]\n'
        f'etcd_cert_file = "{cert}"\netcd_key_file = "{key}"\n'
    )
    with pytest.raises(ConfigError) as err:
        parse_config(text)
    assert any(
        p.startswith("cluster.etcd_key_file") and "chmod 600" in p for p in err.value.problems
    )
    key.chmod(0o600)
    assert parse_config(text).cluster.etcd_key_file == key
