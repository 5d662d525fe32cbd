"""Imports inside daemon/ run one way: down the layers written in daemon/__init__.py.

Every import of a daemon module (at the top, inside a function, or for type
checking only) is read from the source with ast and checked against the layer
of the module that makes it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import daemon
from tests.support.paths import ROOT


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, module) for every daemon module ``path`` imports."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            # `from daemon.x import y` may name the module daemon.x.y
            found += [
                (node.lineno, f"{node.module}.{a.name}")
                for a in node.names
                if is_module(f"{node.module}.{a.name}")
            ]
    return [(line, m) for line, m in found if m == "daemon" or m.startswith("daemon.")]


def is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def layer(module: str) -> int | None:
    """The layer of a daemon module: its own entry, else its package's; None: not a module."""
    parts = module.split(".")
    for n in range(len(parts), 1, -1):
        name = ".".join(parts[1:n])
        if name in daemon.LAYERS:
            return daemon.LAYERS[name]
    return None


def upward_imports() -> list[str]:
    problems = []
    for path in sorted((ROOT / "daemon").rglob("*.py")):
        here = module_name(path)
        if here == "daemon":
            continue  # the package's own __init__: the layers, no imports
        mine = layer(here)
        if mine is None:
            problems.append(f"{here}: in no layer (add it to daemon.LAYERS)")
            continue
        for line, target in imports_of(path):
            theirs = layer(target)
            if theirs is not None and theirs > mine:
                problems.append(f"{here}:{line} imports {target} (layer {theirs} > {mine})")
    return problems


def test_imports_inside_daemon_only_go_down_the_layers() -> None:
    assert upward_imports() == []


def test_every_package_and_top_module_of_daemon_has_a_layer() -> None:
    top = {p.stem for p in (ROOT / "daemon").glob("*.py") if p.stem != "__init__"}
    packages = {p.parent.name for p in (ROOT / "daemon").glob("*/__init__.py")}
    assert (top | packages) - set(daemon.LAYERS) == set()


def test_the_walk_finds_an_upward_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from daemon.http.view import ServiceView\n"
        "def f():\n"
        "    from daemon import cli\n"
    )
    found = imports_of(bad)
    assert (3, "daemon.http.view") in found and (5, "daemon.cli") in found
    assert layer("daemon.http.view") > layer("daemon.delivery.outbox")  # type: ignore[operator]
