"""Every metric and config key the docs name exists: a renamed one fails here, not on a reader.

Metrics: each ``rackguard_*`` name in README.md and docs/*.md must be a family the
agent defines (daemon/, adapters/), with Prometheus' sample suffixes. Config keys:
every ```toml block of the docs is parsed, and each key it sets must be one the
loader accepts in that table (tests/daemon/config/test_example_keys.py's schema).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.config.test_example_keys import schema_keys
from tests.support.paths import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
METRIC = re.compile(r"\brackguard_[a-z0-9_]*[a-z0-9]\b")
DEFINED = re.compile(r"""["'](rackguard_[a-z0-9_]+)["']""")
SUFFIXES = ("", "_total", "_created", "_bucket", "_count", "_sum", "_info")
TOML = re.compile(r"^```toml\n(.*?)^```", re.DOTALL | re.MULTILINE)
# A config written by a shell block (the game day's): cat > NAME.toml <<'EOF' ... EOF
HEREDOC = re.compile(r"^cat > [\w./-]+\.toml <<'EOF'\n(.*?)^EOF$", re.DOTALL | re.MULTILINE)
# Tables whose keys are names the operator chooses, not loader keys.
FREE_FORM = {("policy", "racks"), ("policy", "rack_limits")}


def defined_metrics() -> set[str]:
    names = set()
    for top in ("daemon", "adapters"):
        for path in (ROOT / top).rglob("*.py"):
            names.update(DEFINED.findall(path.read_text(encoding="utf-8")))
    return {n + s for n in names for s in SUFFIXES}


def doc_metrics() -> list[tuple[str, str]]:
    return sorted(
        {(p.name, m) for p in DOCS for m in METRIC.findall(p.read_text(encoding="utf-8"))}
    )


@pytest.mark.parametrize(("doc", "metric"), doc_metrics())
def test_every_metric_the_docs_name_is_exported(doc: str, metric: str) -> None:
    assert metric in defined_metrics(), f"{doc} names {metric}, which the agent does not export"


def test_the_docs_name_metrics_at_all() -> None:
    assert len(doc_metrics()) >= 15


def doc_tables() -> list[tuple[str, int, dict[str, Any]]]:
    """Every TOML the docs show that is a daemon config (not a scenario or a PDU profile)."""
    sections = {s for s, _, _ in schema_keys()}
    out = []
    for p in DOCS:
        text = p.read_text(encoding="utf-8")
        for i, block in enumerate(TOML.findall(text) + HEREDOC.findall(text)):
            data = tomllib.loads(block)
            if "node" in data or set(data) & sections >= {"scheduler"} or "sources" in data:
                out.append((p.name, i, data))
    return out


def _keys(data: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(section, type tag, key) of every key set, as schema_keys() names them."""
    out = []
    for section, table in data.items():
        if not isinstance(table, dict):
            out.append(("", "", section))
            continue
        tables = table.values() if section == "sources" else [table]
        for t in tables:
            if not isinstance(t, dict):
                continue
            tag = str(t.get("type", "")) if section in ("sources", "scheduler") else ""
            out += [(section, tag, k) for k in t if (section, k) not in FREE_FORM]
    return out


@pytest.mark.parametrize(("doc", "index", "data"), doc_tables())
def test_every_config_key_in_the_docs_is_one_the_loader_takes(
    doc: str, index: int, data: dict[str, Any]
) -> None:
    known = set(schema_keys())
    by_section = {(s, k) for s, _, k in known}
    for section, tag, key in _keys(data):
        if (section, tag, key) in known or (not tag and (section, key) in by_section):
            continue
        where = f"[{section}]" + (f" type={tag!r}" if tag else "")
        pytest.fail(f"{doc} toml block {index}: {where} {key} is not a config key")


def test_the_docs_show_config_at_all() -> None:
    assert len(doc_tables()) >= 3
    assert Path(ROOT / "docs" / "scenarios.md").exists()
