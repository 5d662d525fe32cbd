"""The shipped DaemonSet and RBAC manifest, validated against Kubernetes' own schemas.

kubernetes-validate carries the JSON schemas generated from Kubernetes' published
OpenAPI definitions, per release, so this runs offline; strict mode refuses keys
the schema does not know (a typo in a field name fails).
"""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
import yaml

from daemon.config import parse_config
from daemon.deploy import deploy_file

DOCS: list[dict[str, Any]] = [
    d for d in yaml.safe_load_all(deploy_file("kubernetes").read_text()) if d
]
# The oldest and newest Kubernetes releases we claim to work with.
VERSIONS = ("1.29.0", kubernetes_validate.latest_version())


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("doc", DOCS, ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_each_object_matches_the_kubernetes_schema(doc: dict[str, Any], version: str) -> None:
    kubernetes_validate.validate(doc, version, strict=True)


def test_a_misspelt_field_is_refused() -> None:
    (ds,) = [d for d in DOCS if d["kind"] == "DaemonSet"]
    broken = yaml.safe_load(yaml.safe_dump(ds))
    broken["spec"]["template"]["spec"]["containers"][0]["imagePullPolcy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSIONS[-1], strict=True)


def test_the_role_grants_what_the_sink_calls() -> None:
    (role,) = [d for d in DOCS if d["kind"] == "ClusterRole"]
    grants = {
        (res, verb) for rule in role["rules"] for res in rule["resources"] for verb in rule["verbs"]
    }
    assert {
        ("nodes", "get"),
        ("nodes", "patch"),
        ("nodes/status", "patch"),
        ("pods", "list"),
        ("pods/eviction", "create"),
        ("events", "create"),
    } <= grants
    (ds,) = [d for d in DOCS if d["kind"] == "DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    (binding,) = [d for d in DOCS if d["kind"] == "ClusterRoleBinding"]
    assert binding["subjects"][0]["name"] == pod["serviceAccountName"]
    assert any(t["key"] == "rackguard.io/thermal" for t in pod["tolerations"])


def test_the_config_map_holds_a_config_rackguard_accepts() -> None:
    (cm,) = [d for d in DOCS if d["kind"] == "ConfigMap"]
    config = parse_config(cm["data"]["rackguard.toml"])
    assert config.scheduler is not None and config.scheduler.type == "kubernetes"
    assert config.api.listen == "0.0.0.0"
