"""Every key the config loader accepts is documented in systemd/rackguard.example.toml.

The keys are enumerated from the loader's schema (the Config dataclass tree and
every arm of its tagged unions), not listed by hand, so a new key without a line
in the example fails here.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from typing import Any, get_args, get_origin, get_type_hints

import pytest

from daemon.config import Config
from tests.support.paths import ROOT

EXAMPLE = ROOT / "systemd" / "rackguard.example.toml"
_HEADER = re.compile(r"^#?\s*\[([A-Za-z0-9_.-]+)\]\s*(?:#.*)?$")


def _dataclasses(tp: Any) -> list[type[Any]]:
    """The dataclass arms of a field type (X, X | None, A | B | C, dict[str, A | B])."""
    origin = get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return [a for arm in get_args(tp) for a in _dataclasses(arm)]
    if origin is dict:
        return _dataclasses(get_args(tp)[1])
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return [tp]
    return []


def _tag(cls: type[Any]) -> str:
    hint = get_type_hints(cls).get("type")
    return str(get_args(hint)[0]) if hint is not None else ""


def schema_keys() -> list[tuple[str, str, str]]:
    """(section, type tag or "", key) for every key the loader accepts."""
    out: list[tuple[str, str, str]] = []
    for f in dataclasses.fields(Config):
        for cls in _dataclasses(get_type_hints(Config)[f.name]):
            out.extend((f.name, _tag(cls), g.name) for g in dataclasses.fields(cls) if g.init)
    return out


def blocks() -> list[tuple[str, str]]:
    """(section header, text) of every table of the example, commented-out ones included."""
    out: list[tuple[str, list[str]]] = []
    for line in EXAMPLE.read_text().splitlines():
        m = _HEADER.match(line.strip())
        if m:
            out.append((m.group(1), []))
        elif out:
            out[-1][1].append(line)
    return [(h, "\n".join(lines)) for h, lines in out]


def _documents(text: str, key: str) -> bool:
    # `key = ...` on its own line, commented out, or in a `; key = ...` list of a comment.
    return re.search(rf"(?:^|[\s#;]){re.escape(key)}\s*=", text, re.MULTILINE) is not None


@pytest.mark.parametrize(("section", "tag", "key"), schema_keys())
def test_every_loader_key_is_in_the_example(section: str, tag: str, key: str) -> None:
    candidates = [
        text
        for header, text in blocks()
        if header == section or header.startswith(f"{section}.")
        if not tag or re.search(rf'type\s*=\s*"{re.escape(tag)}"', text)
    ]
    where = f"[{section}]" + (f" with type = {tag!r}" if tag else "")
    assert candidates, f"the example has no {where} table (commented out or not)"
    assert any(_documents(text, key) for text in candidates), (
        f"{where}: key {key!r} is not in systemd/rackguard.example.toml"
    )
