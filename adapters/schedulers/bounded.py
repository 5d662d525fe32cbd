"""Reading a peer's answer without trusting its size.

An error body is only ever logged and kept as ``last_error``: a receiver (or a
proxy in front of it) answering with hundreds of megabytes must cost a few KiB,
not the daemon's memory.
"""

from __future__ import annotations

import asyncio

import aiohttp

ERROR_BODY_LIMIT = 8192  # bytes of an error answer kept; the rest is discarded unread


async def read_error_body(resp: aiohttp.ClientResponse, limit: int = ERROR_BODY_LIMIT) -> bytes:
    """At most ``limit`` bytes of a (non-2xx) response body; the connection is not reused."""
    try:
        data = await resp.content.read(limit)
    except (aiohttp.ClientError, TimeoutError):
        return b""
    if not resp.content.at_eof():
        resp.close()  # drop the rest with the connection instead of reading it
    return data


async def read_stream_capped(stream: asyncio.StreamReader | None, limit: int) -> bytes:
    """A child process's output: the first ``limit`` bytes kept, the rest read and dropped.

    Reading on (not stopping) keeps a chatty child from blocking on a full pipe.
    """
    if stream is None:
        return b""
    kept = bytearray()
    while chunk := await stream.read(65536):
        if len(kept) < limit:
            kept += chunk[: limit - len(kept)]
    return bytes(kept)
