"""A simulated node's GPUs shared between processes: `serve` writes them, the fake NVML reads.

`serve` writes one JSON file per node (``STATE_DIR/gpus/NODE.json``) after every
simulator step, atomically (a temporary file renamed over the old one), so a
reader never sees half a file. :class:`ServedNvml` is the fake NVML over such a
file: before each call it reloads the file when it changed and copies the values
into its FakeGpus in place (handles stay valid). A file that is missing or not
ours, or one not rewritten for STALE_AFTER_S (serve stopped), makes every call
fail with NVML_ERROR_UNKNOWN rather than report made-up or frozen GPUs.

A daemon reads a node's file when started by ``rackguard-sim node --gpus FILE --
run --config rackguard.toml``: the real `rackguard` command, the real NVML
adapter, an ordinary config, with this fake injected as the NVML binding.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import orjson
import pynvml

from fakes.gpus import MODELS, FakeGpu, GpuModel
from fakes.nvml import FakeNvml

FORMAT = "rackguard-sim-gpus"
STALE_AFTER_S = 10.0  # a file not rewritten for this long: serve is gone, the GPUs unknown
_STATE_FIELDS = (
    "temperature_c",
    "memory_temperature_c",
    "power_w",
    "power_limit_w",
    "requested_limit_w",
    "external_limit_w",
    "clock_event_reasons",
    "lost",
)


def node_file(state_dir: Path, node: str) -> Path:
    """Where `serve` publishes one node's GPUs."""
    return state_dir / "gpus" / f"{node}.json"


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` in one rename, so readers see the old or the new file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def encode_node(node: str, model_key: str, gpus: list[FakeGpu]) -> bytes:
    """One node's GPUs as the file `serve` writes."""
    return orjson.dumps(
        {
            "format": FORMAT,
            "node": node,
            "model": model_key,
            "written_at": time.time(),
            "gpus": [
                {k: v for k, v in asdict(g).items() if k not in ("model", "delay_s")} for g in gpus
            ],
        }
    )


class ServedNvml(FakeNvml):
    """The fake NVML over a node file that another process keeps up to date."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._raw = b""
        self._written_at = 0.0
        self.problem = ""
        super().__init__([])
        self._refresh()

    def _load(self) -> dict[str, Any] | None:
        """The file's content when it changed since the last call, else None.

        It is read whole every time (a few KB): a stat stamp can miss a rewrite
        within one timestamp tick, and a reading must never lag the rack.
        """
        try:
            raw = self.path.read_bytes()
        except OSError as err:
            self.problem = f"{self.path}: {err.strerror or err}"
            self._raw = b""
            return None
        if raw == self._raw:
            return None
        self._raw = raw
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError as err:
            self.problem = f"{self.path}: unreadable: {err}"
            return None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            self.problem = f"{self.path}: not a {FORMAT} file"
            return None
        self._written_at = float(data.get("written_at", 0.0))
        self.problem = ""
        return data

    def _refresh(self) -> None:
        data = self._load()
        if data is None:
            return
        model: GpuModel = MODELS.get(str(data.get("model")), next(iter(MODELS.values())))
        rows = data.get("gpus", [])
        if len(rows) != len(self.gpus):  # first load, or the rack was re-laid out
            self.gpus = [
                FakeGpu(int(r["index"]), model, str(r["uuid"]), str(r["pci_bus_id"])) for r in rows
            ]
        for gpu, row in zip(self.gpus, rows, strict=True):
            for name in _STATE_FIELDS:
                setattr(gpu, name, row[name])
            gpu.errors = {str(k): int(v) for k, v in row.get("errors", {}).items()}

    def _enter(self, name: str, *, need_init: bool = True) -> None:
        self._refresh()
        age = time.time() - self._written_at
        if not self.problem and age > STALE_AFTER_S:
            self.problem = (
                f"{self.path}: not rewritten for {age:.0f} s (is rackguard-sim serve up?)"
            )
        super()._enter(name, need_init=need_init)
        if self.problem and name != "nvmlShutdown":
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
