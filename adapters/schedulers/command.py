"""Run a short external command (scontrol, a token refresh) without blocking the loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence

from adapters.schedulers.bounded import read_stream_capped

# A token or a line of scontrol output is far smaller; more is a broken or hostile command.
OUTPUT_LIMIT = 64 * 1024


class OutputTooLarge(Exception):
    """The command wrote more than the caller can use: what it said is not whole."""


async def run_command(
    argv: Sequence[str],
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    *,
    limit: int = OUTPUT_LIMIT,
) -> tuple[int, str, str]:
    """(exit code, stdout, stderr), stripped; a command past its time is killed.

    Raises OSError when the command cannot be started, TimeoutError when it runs
    too long and OutputTooLarge when stdout passes ``limit`` bytes (a cut list
    read as a whole one would hide what was cut); callers turn each into their
    own error types. stderr is only ever shown: it is cut at OUTPUT_LIMIT.
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
                read_stream_capped(proc.stdout, limit + 1),
                read_stream_capped(proc.stderr, OUTPUT_LIMIT),
            )
            await proc.wait()
    except BaseException:
        # A timeout or a cancellation (shutdown, a reload): kill and reap the child
        # either way, so neither a process nor its transport outlives the call.
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        # A stop that lands while the killed child is reaped goes on (swallowed, the
        # caller would get the TimeoutError and carry on as if never asked to stop).
        with contextlib.suppress(Exception):
            await proc.wait()
        raise
    rc = proc.returncode if proc.returncode is not None else -1
    if len(out) > limit:
        raise OutputTooLarge(f"{argv[0]} wrote more than {limit} bytes; its output is not used")
    return rc, out.decode(errors="replace").strip(), err.decode(errors="replace").strip()
