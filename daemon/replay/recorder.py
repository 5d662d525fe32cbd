"""The daemon recording its own readings in the trace format, for `rackguard replay`.

Every reading a source delivers is appended as one JSON line, labelled with this
node (GPU readings) or this rack (everything else) so a trace from one agent
replays like a simulator trace. A file that grows past ``max_bytes`` is rotated
to ``<path>.1`` (replacing the previous one) and a new file starts with its own
header: a recording costs at most twice ``max_bytes`` of disk.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from types import MappingProxyType
from typing import TextIO

import msgspec

from policies.model import Reading
from policies.trace import encode_header, encode_reading
from policies.tracking import gpu_kind

log = logging.getLogger(__name__)


class TraceRecorder:
    """Appends readings to a trace file; ``record`` fits a SourceRunner's readings callback."""

    def __init__(self, path: Path, node: str, rack: str, *, max_bytes: int = 256 << 20) -> None:
        self.path = path
        self.node = node
        self.rack = rack
        self.max_bytes = max_bytes
        self._file: TextIO | None = None
        self._size = 0
        self.failed = False

    def _open(self) -> TextIO:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        f = self.path.open("a", encoding="utf-8")
        self._size = f.tell()
        if self._size == 0:
            self._write(f, encode_header({self.rack: (self.node,)}, {"source": "rackguard"}))
        log.info("%s: recording readings to %s", self.node, self.path)
        return f

    def _write(self, f: TextIO, line: str) -> None:
        f.write(line + "\n")
        self._size += len(line) + 1

    def record(self, source: str, readings: Sequence[Reading]) -> None:
        """Append one poll's readings; a failing disk stops the recording, not the daemon."""
        if self.failed or not readings:
            return
        try:
            f = self._file or self._open()
            self._file = f
            for r in readings:
                self._write(f, encode_reading(self._labelled(r)))
            f.flush()
            if self._size >= self.max_bytes:
                self._rotate(f)
        except OSError as err:
            self.failed = True
            log.error("%s: trace recording to %s stopped: %s", self.node, self.path, err)

    def _labelled(self, r: Reading) -> Reading:
        key, value = ("node", self.node) if gpu_kind(r.kind) else ("rack", self.rack)
        if r.labels.get(key) == value:
            return r
        # Every other field as it came (server_ts included: it used to be dropped here).
        return msgspec.structs.replace(r, labels=MappingProxyType({**r.labels, key: value}))

    def _rotate(self, f: TextIO) -> None:
        f.close()
        self._file = None
        os.replace(self.path, self.path.with_name(self.path.name + ".1"))
        log.info("%s: trace %s rotated", self.node, self.path)

    def close(self) -> None:
        """Close the file (a later record reopens it)."""
        if self._file is not None:
            self._file.close()
            self._file = None
