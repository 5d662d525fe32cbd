"""The `rackguard` command's own handling of its output: a full disk, a reader that leaves."""

from __future__ import annotations

import subprocess
import sys

from tests.support.paths import ROOT

FILES_CONFIG = [sys.executable, "-m", "daemon.cli", "files", "config"]


def test_output_on_a_full_disk_is_one_line_and_exit_1() -> None:
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            FILES_CONFIG, cwd=ROOT, stdout=full, stderr=subprocess.PIPE, text=True, check=False
        )
    assert done.returncode == 1
    assert done.stderr == "rackguard: [Errno 28] No space left on device\n", done.stderr


def test_output_into_a_closed_pipe_ends_quietly() -> None:
    """`rackguard files config | head -1`, the reader gone before the first write."""
    proc = subprocess.Popen(
        FILES_CONFIG, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    proc.stdout.close()
    _, stderr = proc.communicate(timeout=60)
    assert (proc.returncode, stderr) == (0, "")
