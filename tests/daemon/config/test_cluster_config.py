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
