"""The compiled build of the policy: taken only when it fits, and the same decisions as the sources.

The rest of the suite runs the sources (tests/conftest.py). Here the build is made
if it is missing or stale, and the policy's and replay's tests (the replay goldens
among them: every scenario trace, its decisions and every assessment, byte for
byte) run again on it in a child process.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from policies import native

ROOT = Path(__file__).resolve().parents[2]
_BUILD_TIMEOUT_S = 600
_RUN_TIMEOUT_S = 1200


@pytest.fixture(scope="module")
def built() -> Iterator[Path]:
    """The repository's build/native, made by scripts/build_native.py when it does not fit."""
    if native.build_problem():
        done = subprocess.run(
            [sys.executable, "scripts/build_native.py"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=_BUILD_TIMEOUT_S,
            check=False,
        )
        assert done.returncode == 0, (
            f"the build failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        )
    assert native.build_problem() == ""
    yield native.BUILD_DIR


def _python(code: str, *, pure: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, native.PURE_ENV: pure}
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


_WHICH = (
    "import policies.tracking as t, policies.model as m, policies.native as n;"
    "print(n.COMPILED, t.__file__.endswith('.py'), m.__file__.endswith('.py'))"
)


def test_a_fitting_build_is_taken_and_the_switch_turns_it_off(built: Path) -> None:
    on = _python(_WHICH, pure="0")
    assert on.returncode == 0, on.stderr
    # The hot modules come from the build; the models (msgspec Structs) stay sources.
    assert on.stdout.split() == ["True", "False", "True"]
    off = _python(_WHICH, pure="1")
    assert off.returncode == 0, off.stderr
    assert off.stdout.split() == ["False", "True", "True"]


def test_a_build_whose_runtime_is_missing_leaves_the_sources(built: Path) -> None:
    # The packed vectors come from librt (installed with mypy): a node that has the
    # build but not librt runs the sources, not a package that fails to import.
    code = (
        "import sys; sys.modules['librt.vecs'] = None;"
        "import policies.native as n, policies.forecast as f;"
        "print(n.COMPILED, f.__file__.endswith('.py')); print(n.WHY_NOT)"
    )
    done = _python(code, pure="0")
    assert done.returncode == 0, done.stderr
    taken, why = done.stdout.splitlines()
    assert taken.split() == ["False", "True"]
    assert why.startswith("cannot import librt.vecs, which the build needs")


def _copy(built: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "native"
    shutil.copytree(built, copy)
    return copy


def test_a_build_of_other_sources_is_stale(built: Path, tmp_path: Path) -> None:
    copy = _copy(built, tmp_path)
    manifest = json.loads((copy / native.MANIFEST).read_text())
    assert native.build_problem(copy) == ""
    manifest["sources"]["settings.py"] = "0" * 64  # a module it only imports counts too
    (copy / native.MANIFEST).write_text(json.dumps(manifest))
    assert native.build_problem(copy).startswith("stale")
    del manifest["sources"]["settings.py"]
    (copy / native.MANIFEST).write_text(json.dumps(manifest))
    assert native.build_problem(copy).startswith("stale")


def test_a_build_for_another_interpreter_is_refused(built: Path, tmp_path: Path) -> None:
    copy = _copy(built, tmp_path)
    manifest = json.loads((copy / native.MANIFEST).read_text())
    manifest["abi"] = "cpython-312 .cpython-312-x86_64-linux-gnu.so"
    (copy / native.MANIFEST).write_text(json.dumps(manifest))
    assert "this interpreter is" in native.build_problem(copy)


def test_a_damaged_build_is_refused(built: Path, tmp_path: Path) -> None:
    # A truncated library would crash the process that maps it: it is never loaded.
    copy = _copy(built, tmp_path)
    library = next((copy / "policies").glob(f"{native.GROUP}__mypyc*"))
    library.write_bytes(library.read_bytes()[:4096])
    assert native.build_problem(copy).startswith("damaged")
    # One module missing would mix compiled and source classes of one package.
    copy = _copy(built, tmp_path / "again")
    next((copy / "policies").glob("tracking.*")).unlink()
    assert native.build_problem(copy).startswith("damaged")


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (None, "not built"),
        (b"{not json", "unreadable"),
        (b"[1]", "unreadable manifest: not an object"),
        (b"\xff", ""),
    ],
)
def test_no_or_a_broken_manifest_is_no_build(
    tmp_path: Path, content: bytes | None, why: str
) -> None:
    if content is not None:
        (tmp_path / native.MANIFEST).write_bytes(content)
    assert native.build_problem(tmp_path).startswith(why or "unreadable")


def test_the_policy_and_replay_tests_pass_on_the_compiled_build(built: Path) -> None:
    # The suite's policy and replay tests (this module aside), in a child process
    # whose conftest refuses to start unless the compiled modules were taken.
    env = {**os.environ, native.PURE_ENV: "0"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/policies",
            "tests/daemon/replay",
            "--ignore=tests/policies/test_native.py",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=_RUN_TIMEOUT_S,
        check=False,
    )
    tail = done.stdout[-4000:] + done.stderr[-2000:]
    assert done.returncode == 0, tail
    assert " passed" in done.stdout and " failed" not in done.stdout, tail
