"""The production wheel: the agent and its deployment files, no fakes, no development package.

Built from this checkout without network (--no-build-isolation), installed into a
fresh venv; its dependencies' closure is resolved from the distributions in this
venv (which `make` installs from constraints.txt, as a node does).
"""

from __future__ import annotations

import subprocess
import sys
import venv
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.support.paths import ROOT

DEVELOPMENT = {
    "rackguard-sim",
    "snmpsim",
    "pysmi",
    "pytest",
    "pytest-asyncio",
    "mypy",
    "ruff",
    "hypothesis",
    "jsonschema",
    "kubernetes-validate",
}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    (built,) = out.glob("rackguard-*.whl")
    return built


def _runtime(requirements: list[str]) -> list[Requirement]:
    """The requirements that apply here without extras (markers evaluated)."""
    out = [Requirement(r) for r in requirements]
    return [r for r in out if r.marker is None or r.marker.evaluate({"extra": ""})]


def _key(r: Requirement) -> str:
    return r.name.lower().replace("_", "-")


def test_the_wheel_holds_the_agent_and_its_files_and_no_fakes(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.startswith("rackguard-")}
    assert tops == {"daemon", "adapters", "policies"}
    for shipped in (
        "daemon/deploy/rackguard.service",
        "daemon/deploy/rackguard-powercap.socket",
        "daemon/deploy/rackguard-powercap.service",
        "daemon/deploy/rackguard.example.toml",
        "daemon/deploy/prometheus/rackguard-alerts.yml",
        "daemon/deploy/grafana/rackguard-dashboard.json",
        "daemon/deploy/kubernetes/rackguard.yaml",
        "daemon/http/static/index.html",
        "daemon/http/static/page.js",
    ):
        assert shipped in names


def test_its_dependencies_pull_no_development_package(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        requires = [
            line.split(":", 1)[1].strip()
            for line in z.read(meta).decode().splitlines()
            if line.startswith("Requires-Dist:")
        ]
    runtime = _runtime(requires)
    assert all(any(s.operator == "<" for s in r.specifier) for r in runtime), "bounded"
    closure: set[str] = set()
    todo = [_key(r) for r in runtime]
    while todo:
        name = todo.pop()
        if name in closure:
            continue
        closure.add(name)
        todo += [_key(r) for r in _runtime(metadata.distribution(name).requires or [])]
    assert not closure & DEVELOPMENT, sorted(closure & DEVELOPMENT)
    assert {"aiohttp", "pysnmp", "asyncua", "nvidia-ml-py"} <= closure


def test_a_fresh_install_runs_and_has_no_fakes(wheel: Path, tmp_path: Path) -> None:
    env = tmp_path / "venv"
    venv.create(env, with_pip=False)
    py = env / "bin" / "python"
    site = next((env / "lib").glob("python3*/site-packages"))
    # Install without pip's index: unpack the wheel, as pip would, into the fresh venv.
    zipfile.ZipFile(wheel).extractall(site)
    # Third-party dependencies from this venv's site-packages, appended after the
    # fresh venv's own (its .pth files, and so our editable installs, are not read).
    deps = next(Path(p) for p in sys.path if p.endswith("site-packages"))
    (site / "zz-deps.pth").write_text(f"{deps}\n")
    run = subprocess.run(
        [
            str(py),
            "-c",
            "import daemon.cli, sys; sys.argv = ['rackguard', '--version']; daemon.cli.main()",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.stdout.startswith("rackguard 0.1.0"), run.stdout + run.stderr
    assert run.stdout.rstrip().endswith(")") and "(Python 3." in run.stdout, run.stdout
    probe = subprocess.run(
        [str(py), "-c", "import fakes"], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert probe.returncode != 0 and "No module named 'fakes'" in probe.stderr
    demo = subprocess.run(
        [str(py), "-c", "import daemon.cli; daemon.cli.main(['demo'])"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert demo.returncode != 0 and "invalid choice: 'demo'" in demo.stderr
