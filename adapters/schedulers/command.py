"""Run a short external command (scontrol, a token refresh) without blocking the loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence

from adapters.schedulers.bounded import read_stream_capped

# A token or a line of scontrol output is far smaller; more is a broken or hostile command.
OUTPUT_LIMIT = 64 * 1024


async def run_command(
    argv: Sequence[str], timeout_s: float, env: Mapping[str, str] | None = None
) -> tuple[int, str, str]:
    """(exit code, stdout, stderr), stripped and capped; a command past its time is killed.

    Raises OSError when the command cannot be started and TimeoutError when it
    runs too long; callers turn both into their own error types.
    """
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=dict(env) if env is not None else None,
    )
    try:
        async with asyncio.timeout(timeout_s):
            out, err = await asyncio.gather(
                read_stream_capped(proc.stdout, OUTPUT_LIMIT),
                read_stream_capped(proc.stderr, OUTPUT_LIMIT),
            )
            await proc.wait()
    except BaseException:
        # A timeout or a cancellation (shutdown, a reload): kill and reap the child
        # either way, so neither a process nor its transport outlives the call.
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await proc.wait()
        raise
    rc = proc.returncode if proc.returncode is not None else -1
    return rc, out.decode(errors="replace").strip(), err.decode(errors="replace").strip()
