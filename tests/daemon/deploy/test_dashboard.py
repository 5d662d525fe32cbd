"""The shipped dashboard and alert rules: valid, parseable, on metrics a live agent exports."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from daemon.deploy import deploy_file
from fakes.nvml import fake_node
from fakes.scheduler import FakeWebhookScheduler
from tests.support.daemon_harness import running_daemon
from tests.support.promql import check_parse, exported_names, metric_names, substitute
from tests.support.scrape import scrape_text
from tests.support.tools import require

DASHBOARD: dict[str, Any] = json.loads(deploy_file("dashboard").read_text())
RULES: dict[str, Any] = yaml.safe_load(deploy_file("alerts").read_text())
# Grafana's built-in interval variables, and our template variables, as PromQL accepts them.
VARIABLES = {"__rate_interval": "5m", "__interval": "1m", "rack": ".*", "instance": ".*"}
PANEL_TYPES = {"row", "stat", "timeseries", "table", "state-timeline", "heatmap", "bargauge"}
# Series Prometheus itself makes for every scrape target, not the agent.
SCRAPE_SERIES = {"up"}


def panels() -> list[dict[str, Any]]:
    return [p for p in DASHBOARD["panels"] if p["type"] != "row"]


def dashboard_exprs() -> list[str]:
    exprs = [t["expr"] for p in panels() for t in p["targets"]]
    exprs += [a["expr"] for a in DASHBOARD["annotations"]["list"]]
    for var in DASHBOARD["templating"]["list"]:
        if var["type"] == "query":
            m = re.fullmatch(r"label_values\((.+),\s*\w+\)", var["query"]["query"])
            assert m, f"variable {var['name']}: a label_values() query"
            exprs.append(m.group(1))
    return [substitute(e, VARIABLES) for e in exprs]


def rule_exprs() -> list[str]:
    return [r["expr"] for g in RULES["groups"] for r in g["rules"]]


@pytest.fixture
async def exposition(receiver: FakeWebhookScheduler, secret_file: Path) -> str:
    """A real daemon's /metrics body, on the fake NVML."""
    nvml = fake_node()
    async with running_daemon(nvml, receiver, secret_file) as daemon:
        return await scrape_text(daemon.api_port)


@pytest.fixture
def exported(exposition: str) -> set[str]:
    """Every metric name that agent exports (families with no series yet included)."""
    return exported_names(exposition)


def test_the_live_exposition_follows_prometheus_naming(exposition: str) -> None:
    promtool = require("promtool")
    out = subprocess.run(
        [promtool, "check", "metrics"],
        input=exposition,
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0 and not out.stdout.strip(), out.stdout + out.stderr


def test_the_dashboard_is_a_valid_grafana_dashboard() -> None:
    d = DASHBOARD
    assert d["uid"] == "rackguard" and d["title"] and isinstance(d["schemaVersion"], int)
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    variables = {v["name"] for v in d["templating"]["list"]}
    assert {"datasource", "rack", "instance"} <= variables
    for p in d["panels"]:
        assert p["type"] in PANEL_TYPES, p["title"]
        pos = p["gridPos"]
        assert pos["x"] >= 0 and pos["w"] > 0 and pos["x"] + pos["w"] <= 24, p["title"]
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            used = set(re.findall(r"\$\{?(\w+)", t["expr"]))
            assert used <= variables | {"__rate_interval", "__interval"}, (p["title"], used)


def test_what_the_issue_asks_the_dashboard_to_show() -> None:
    titles = {p["title"] for p in panels()}
    assert {
        "Nodes by condition",
        "Lowest GPU margin, rack x node",
        "Decisions",
        "Deliveries pending and failing",
        "GPU temperature and slowdown threshold",
        "GPU margin and forecast time to slowdown",
        "Inlet air and coolant",
    } <= titles
    (matrix,) = [p for p in panels() if p["title"] == "Lowest GPU margin, rack x node"]
    (grouping,) = matrix["transformations"]
    assert grouping["options"]["rowField"] == "rack"
    assert grouping["options"]["columnField"] == "node"


def test_every_dashboard_and_rule_expression_parses(tmp_path: Path) -> None:
    promtool = require("promtool")
    out = check_parse(promtool, dashboard_exprs() + rule_exprs(), tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_metric_name_finder_sees_through_promql() -> None:
    expr = (
        'sum by (reason) (rate(a_total{x="b_c", y=~"$v"}[5m])) '
        "* on (instance) group_left (node, rack) b_info or vector(0) > bool 1"
    )
    assert metric_names(expr) == {"a_total", "b_info"}


async def test_dashboard_queries_use_only_metrics_a_live_agent_exports(
    exported: set[str],
) -> None:
    used = set().union(*(metric_names(e) for e in dashboard_exprs()))
    assert "rackguard_gpu_thermal_margin_celsius" in used
    missing = used - exported
    assert not missing, f"the dashboard queries metrics no agent exports: {sorted(missing)}"


async def test_alert_rules_use_only_metrics_a_live_agent_exports(exported: set[str]) -> None:
    used = set().union(*(metric_names(e) for e in rule_exprs()))
    missing = used - exported - SCRAPE_SERIES
    assert not missing, f"the alert rules query metrics no agent exports: {sorted(missing)}"
