"""Run a command whose stdout fails: a full disk under it, or a reader that has left."""

from __future__ import annotations

import subprocess

from tests.support.paths import ROOT


def into_full_disk(command: list[str]) -> tuple[int, str]:
    """``command > /dev/full``: its exit status and stderr."""
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            command, cwd=ROOT, stdout=full, stderr=subprocess.PIPE, text=True, check=False
        )
    return done.returncode, done.stderr


def into_closed_pipe(command: list[str]) -> tuple[int, str]:
    """``command | head -0``, the reader gone before the first write: exit status, stderr."""
    proc = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    proc.stdout.close()
    _, stderr = proc.communicate(timeout=120)
    return proc.returncode, stderr
