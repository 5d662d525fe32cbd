"""Compile the policy's hot modules with mypyc into build/native (``make native``).

Run from the repository root by the virtual environment's Python. The compiled
modules go to ``build/native/policies/``, beside a manifest of the digests of the
sources they were built from; :mod:`policies.native` uses them only while those
digests still match. Needs a C compiler and the interpreter's headers.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

from policies import native


def build(root: Path) -> Path:
    """Build into ``root/build/native``; returns the manifest's path."""
    # Imported here: mypyc and setuptools are build tools, not the daemon's dependencies.
    from mypyc.build import mypycify  # noqa: PLC0415
    from setuptools import Distribution  # noqa: PLC0415

    out = root / "build" / "native"
    digests = native.source_digests(root / "policies")
    sources = [f"policies/{name}.py" for name in native.COMPILED_MODULES]
    with tempfile.TemporaryDirectory(prefix="rackguard-native-") as tmp:
        staged = Path(tmp) / "lib"
        extensions = mypycify(
            sources,
            opt_level="3",
            group_name=f"policies.{native.GROUP}",
            target_dir=str(Path(tmp) / "c"),
        )
        dist = Distribution({"name": "rackguard-native", "ext_modules": extensions})
        cmd = dist.get_command_obj("build_ext")
        cmd.build_lib = str(staged)
        cmd.build_temp = str(Path(tmp) / "obj")
        dist.run_command("build_ext")
        # The sources may have changed while they compiled: digests taken before.
        if native.source_digests(root / "policies") != digests:
            raise SystemExit("build_native: the sources changed during the build; run it again")
        manifest = {
            "abi": native.abi_tag(),
            "modules": list(native.COMPILED_MODULES),
            "sources": digests,
            "compiled": native.compiled_digests(staged),
        }
        # The manifest first: a process importing the package meanwhile sees no build.
        (out / native.MANIFEST).unlink(missing_ok=True)
        shutil.rmtree(out, ignore_errors=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(staged, out)
    path = out / native.MANIFEST
    path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return path


def main() -> int:
    """Build, then check that this interpreter would take the build."""
    root = Path(__file__).resolve().parent.parent
    path = build(root)
    if root / "policies" != native.SOURCE_DIR:
        print(f"build_native: built {path.parent}, but this interpreter imports the policy")
        print(f"  from {native.SOURCE_DIR}; run it with this checkout's virtual environment")
        return 1
    problem = native.build_problem(path.parent)
    if problem:
        print(f"build_native: {path.parent} would not be used: {problem}")
        return 1
    print(f"build_native: wrote {path.parent}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
