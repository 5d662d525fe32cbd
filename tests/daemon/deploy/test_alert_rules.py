"""The shipped alert rules: valid, and each fires when, and only when, it should."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from daemon.deploy import deploy_file
from tests.support.tools import require

HERE = Path(__file__).parent
RULE_TESTS = HERE / "rackguard-alerts.test.yml"
RULES = Path(str(deploy_file("alerts")))


def test_the_rules_are_valid_prometheus_rules() -> None:
    promtool = require("promtool")
    out = subprocess.run(
        [promtool, "check", "rules", str(RULES)], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_alert_behaves_as_its_promtool_test_says() -> None:
    promtool = require("promtool")
    out = subprocess.run(
        [promtool, "test", "rules", RULE_TESTS.name],
        cwd=HERE,
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_every_alert_has_a_promtool_test() -> None:
    rules = yaml.safe_load(RULES.read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    tests = yaml.safe_load(RULE_TESTS.read_text())
    tested = {t["alertname"] for case in tests["tests"] for t in case["alert_rule_test"]}
    assert alerts == tested
    assert len(alerts) == 8
