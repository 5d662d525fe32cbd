"""The `rackguard` command's own handling of its output: a full disk, a reader that leaves."""

from __future__ import annotations

import subprocess
import sys

from tests.support.output import into_closed_pipe, into_full_disk
from tests.support.paths import ROOT

FILES_CONFIG = [sys.executable, "-m", "daemon.cli", "files", "config"]


def test_output_on_a_full_disk_is_one_line_and_exit_1() -> None:
    assert into_full_disk(FILES_CONFIG) == (1, "rackguard: [Errno 28] No space left on device\n")


def test_output_into_a_closed_pipe_ends_quietly() -> None:
    """`rackguard files config | head -1`, the reader gone before the first write."""
    assert into_closed_pipe(FILES_CONFIG) == (0, "")


def test_files_constraints_prints_the_pins_this_release_was_tested_with() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "daemon.cli", "files", "constraints"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out == (ROOT / "constraints.txt").read_text()
    assert "\naiohttp==" in out
