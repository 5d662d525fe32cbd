"""Secrets live in files (or systemd credentials), never in the main config."""

from __future__ import annotations

import os
import stat
from pathlib import Path


def secret_problem(path: Path, *, private: bool = True) -> str | None:
    """Why a secret file is unusable, or None.

    Like ssh with a private key, a secret that group or others may read is
    refused: it has already leaked to every local user (HPC job users are local).
    ``private=False`` is for public material kept beside secrets (certificates):
    it must be readable and not empty, whoever else may read it.
    """
    kind = "secret file" if private else "file"
    try:
        with path.open("rb") as fh:
            mode = stat.S_IMODE(os.fstat(fh.fileno()).st_mode)
            if private and mode & 0o077:
                return (
                    f"secret file {str(path)!r} is accessible by group or others"
                    f" (mode {mode:04o}); make it private: chmod 600"
                )
            if not fh.read(4096).strip():
                return f"{kind} {str(path)!r} is empty"
    except OSError as err:
        problem = f"{kind} {str(path)!r} cannot be read: {err.strerror or err}"
        if _bare(path) and not os.environ.get("CREDENTIALS_DIRECTORY"):
            # Outside systemd a bare credential name has nowhere to resolve: say so.
            problem += (
                "; a bare name is a systemd credential (LoadCredential=), read from"
                " $CREDENTIALS_DIRECTORY, which is not set here: set it to the folder"
                " holding the file, or give the file's path"
            )
        return problem
    return None


def _bare(path: Path) -> bool:
    return not path.is_absolute() and len(path.parts) == 1


def read_secret(path: Path) -> bytes:
    """The secret's bytes with surrounding whitespace removed (files usually end in a newline).

    Under systemd a configured file may be read from $CREDENTIALS_DIRECTORY
    (LoadCredential=; see resolve_secret), so the unit and the config name the same
    credential.
    """
    return resolve_secret(path).read_bytes().strip()


def resolve_secret(path: Path) -> Path:
    """Where a configured secret file really is (see read_secret).

    Under systemd (``$CREDENTIALS_DIRECTORY`` set) a bare name is a credential; so
    is a path the service cannot read when a credential of its file name was loaded
    (``LoadCredential=webhook.key:/etc/rackguard/webhook.key``): the
    DynamicUser cannot open the root-only original, only systemd's copy of it. The
    same config then names the real file for ``check-config`` from a root shell.
    """
    creds = os.environ.get("CREDENTIALS_DIRECTORY")
    if not creds:
        return path
    if _bare(path):
        return Path(creds) / path
    copy = Path(creds) / path.name
    if not os.access(path, os.R_OK) and copy.is_file():
        if _missing(path) and not copy.read_bytes().strip():
            # The unit's blank SetCredential= default: LoadCredential= found no
            # file. Name the missing file, not systemd's blank stand-in.
            return path
        return copy
    return path


def _missing(path: Path) -> bool:
    try:
        path.stat()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return False
