"""Compiled copies of the policy's hot modules, used only when built from these very sources.

``make native`` compiles the modules in :data:`COMPILED_MODULES` with mypyc (the
compiler mypy ships: it reads the type hints this code already has) into
``build/native/``, with a manifest of the SHA-256 of every ``policies/*.py`` they
were built from. At the first import of ``policies`` this module checks that
manifest against the sources beside it; only if every digest, the interpreter's
ABI, the compiled files' own digests, the library's import and the modules it
imports at run time (:data:`RUNTIME_MODULES`) check out does it
put the compiled directory first on the package's ``__path__``. Otherwise,
silently, nothing changes and the ``.py`` files run: an edited source is never
shadowed by a stale build, a damaged build is never loaded, and a node installed
from a wheel runs pure Python.

The compiled modules are the same code (the replay goldens hold for both, see
``tests/policies/test_native.py``), replay about three times as fast. Where a compiled
module keeps floats packed (PackedSlopes, PackedRecent: librt's vectors, which are
calls when interpreted), the sources keep the list or deque version, and the tests
hold the two to the same results. ``RACKGUARD_PURE_PYTHON=1`` turns them off.

Hot dataclasses (those a replay builds per bucket, per fit, per GPU or node and
evaluation) are declared ``init=False`` with their ``__init__`` written out,
setting each field with ``object.__setattr__`` as the generated one does. The
generated ``__init__`` is made at run time, so it stays interpreted in the build:
about 650 ns per frozen instance against about 40 ns written out and compiled. The
class stays a frozen dataclass (fields, ``replace``, equality, repr);
``tests/policies/test_hot_dataclasses.py`` holds each ``__init__`` to its fields.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import sys
import sysconfig
from pathlib import Path

# What the build compiles (policies/<name>.py); every other module stays a source.
COMPILED_MODULES = (
    "attribution",
    "forecast",
    "gradient",
    "headroom",
    "policy",
    "replay",
    "rules",
    "safety",
    "search",
    "trace",
    "tracking",
    "window",
)
# What the compiled modules import when they load, beyond the package: the packed
# vectors of doubles (PackedSlopes) come from librt, which mypy installs with itself.
RUNTIME_MODULES = ("librt.vecs",)
GROUP = "_compiled"  # the shared library: policies/_compiled__mypyc<EXT_SUFFIX>
MANIFEST = "manifest.json"
PURE_ENV = "RACKGUARD_PURE_PYTHON"

SOURCE_DIR = Path(__file__).resolve().parent
BUILD_DIR = SOURCE_DIR.parent / "build" / "native"


def source_digests(source_dir: Path = SOURCE_DIR) -> dict[str, str]:
    """The SHA-256 of every module of the package, by file name.

    All of them, not only the compiled ones: mypyc compiles against the types of
    the modules a compiled one imports (a Reading's fields, the settings).
    """
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(source_dir.glob("*.py"))
    }


def compiled_digests(build_dir: Path) -> dict[str, str]:
    """The SHA-256 of every file the build put in ``build_dir/policies``, by file name."""
    folder = build_dir / "policies"
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.iterdir())
        if p.is_file()
    }


def abi_tag() -> str:
    """What a compiled module is tied to: the interpreter and its extension suffix."""
    return f"{sys.implementation.cache_tag} {sysconfig.get_config_var('EXT_SUFFIX')}"


def build_problem(build_dir: Path = BUILD_DIR) -> str:
    """Why the build in ``build_dir`` does not fit these sources or this Python ('' if it does)."""
    try:
        manifest = json.loads((build_dir / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return "not built (make native)"
    except (OSError, ValueError) as e:
        return f"unreadable manifest: {e}"
    if not isinstance(manifest, dict):
        return "unreadable manifest: not an object"
    if manifest.get("abi") != abi_tag():
        return f"built for {manifest.get('abi')!r}, this interpreter is {abi_tag()!r}"
    try:
        digests = source_digests()
    except OSError as e:
        return f"cannot read the sources: {e}"
    if manifest.get("sources") != digests:
        return "stale: the sources changed since the build (make native)"
    # The compiled files as built, every one: a truncated library crashes the process
    # that maps it (SIGBUS), and a missing module would mix compiled and source classes.
    try:
        compiled = compiled_digests(build_dir)
    except OSError as e:
        return f"cannot read the build: {e}"
    if manifest.get("compiled") != compiled:
        return "damaged: the compiled files differ from the build's (make native)"
    return ""


def _activate() -> tuple[bool, str]:
    package = sys.modules.get(__name__.rpartition(".")[0])
    if package is None:
        return False, "imported outside its package"
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return False, f"{PURE_ENV} is set"
    why = build_problem(BUILD_DIR)
    if why:
        return False, why
    for name in RUNTIME_MODULES:
        try:
            importlib.import_module(name)
        except Exception as e:  # whatever the failure, the sources still work
            return False, f"cannot import {name}, which the build needs: {e}"
    compiled_dir = str(BUILD_DIR / "policies")
    path = package.__path__
    path.insert(0, compiled_dir)
    try:
        # The library every compiled module links to; if it cannot load (a missing
        # runtime, a broken file), the package goes back to its sources.
        importlib.import_module(f"{package.__name__}.{GROUP}__mypyc")
    except Exception as e:  # whatever the failure, the sources still work
        path.remove(compiled_dir)
        return False, f"cannot load the compiled library: {e}"
    return True, ""


COMPILED, WHY_NOT = _activate()
