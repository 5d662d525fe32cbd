"""Debian tools the tests drive (promtool, chromium): found, or a failure naming the fix."""

from __future__ import annotations

import shutil

import pytest

INSTALLER = "scripts/install-observability-tools.sh"


def require(tool: str) -> str:
    """The tool's path; fails (never skips) naming the installer `make test` runs."""
    path = shutil.which(tool)
    if path is None:
        pytest.fail(f"{tool} is not installed: run {INSTALLER} as root (make test does)")
    return path
