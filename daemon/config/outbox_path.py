"""Where the outbox lives, and whether this user could open it there (for check-config)."""

from __future__ import annotations

import os
from pathlib import Path

MEMORY = ":memory:"


def default_path() -> Path:
    """Where the outbox lives when the config does not say: systemd's StateDirectory."""
    state = os.environ.get("STATE_DIRECTORY", "/var/lib/rackguard").split(":")[0]
    return Path(state) / "outbox.sqlite3"


def outbox_location(configured: Path | None) -> str:
    """The configured path, ``:memory:`` only when asked for, else the default file."""
    return str(configured) if configured is not None else str(default_path())


def location_problem(path: str) -> str | None:
    """Why the outbox could not be opened read-write at ``path`` (for check-config), or None."""
    if path == MEMORY:
        return None
    target = Path(path)
    if target.is_dir():
        return f"{path!r} is a directory; name a file in it"
    if target.exists():
        if not os.access(target, os.R_OK | os.W_OK):
            return f"{path!r} is not readable and writable by this user"
        parent = target.parent
    else:
        parent = target.parent
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent  # the outbox creates missing directories
    if not parent.is_dir():
        return f"{str(parent)!r} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"directory {str(parent)!r} is not writable by this user (or is read-only)"
    return None
