"""Stopping the external programs some fakes run (snmpd, snmpsim)."""

from __future__ import annotations

import subprocess


def stop_process(proc: subprocess.Popen[bytes] | None, grace_s: float = 10.0) -> None:
    """Terminate, wait ``grace_s``, then kill; a process already gone is fine."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
