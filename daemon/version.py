"""The installed rackguard's version, from its distribution metadata (pyproject.toml)."""

from __future__ import annotations

from importlib import metadata


def package_version() -> str:
    """The version of the installed `rackguard` distribution ("unknown" when run uninstalled)."""
    try:
        return metadata.version("rackguard")
    except metadata.PackageNotFoundError:
        return "unknown"
