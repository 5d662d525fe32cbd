"""PromQL for the tests: the metric names in an expression, and promtool parsing it."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

_KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset"}
    | {"and", "or", "unless", "atan2", "inf", "nan"}
)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_LABEL_LIST = re.compile(
    r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", re.IGNORECASE
)
_IDENT = re.compile(r"(?<![\w:.])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w:])(\s*\()?")


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects (functions, keywords and labels left out)."""
    text = _STRING.sub('""', expr)
    text = _MATCHERS.sub("", text)
    text = _RANGE.sub("", text)
    text = _LABEL_LIST.sub("", text)
    names = set()
    for m in _IDENT.finditer(text):
        name, call = m.group(1), m.group(2)
        if call or name.lower() in _KEYWORDS or re.fullmatch(r"\d", name[0]):
            continue
        names.add(name)
    return names


def exported_names(exposition: str) -> set[str]:
    """Every sample name a /metrics body can carry, from its families (empty ones included)."""
    suffixes = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_count", "_sum", "_created"),
        "summary": ("_count", "_sum", "_created"),
        "gauge": ("",),
        "info": ("_info",),
    }
    names = set()
    for family in text_string_to_metric_families(exposition):
        for suffix in suffixes.get(family.type, ("",)):
            names.add(family.name + suffix)
        names.update(s.name for s in family.samples)
    return names


def substitute(expr: str, variables: Mapping[str, str]) -> str:
    """Grafana's $variables replaced by values PromQL accepts."""
    for name, value in sorted(variables.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(f"${{{name}}}", value).replace(f"${name}", value)
    return expr


def check_parse(
    promtool: str, exprs: Iterable[str], workdir: Path
) -> subprocess.CompletedProcess[str]:
    """`promtool check rules` over the expressions as recording rules: parse errors name them."""
    rules = [{"record": f"check:expr_{i}", "expr": e} for i, e in enumerate(exprs)]
    path = workdir / "exprs.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "check", "rules": rules}]}))
    return subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
