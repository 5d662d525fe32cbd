"""A module-shaped fake NVML fed from a file, for one `rackguard run` process per simulated node.

``python -m fakes.nvml_fed run --config ...`` with ``RACKGUARD_FAKE_GPU_FEED=FILE``
(the config cannot select a fake: this entry point injects it): the
simulator (in another process) rewrites FILE atomically with the node's GPU
state (:func:`fakes.sim.nvml_bridge.write_feed`); every temperature read here
first takes the newest copy, so the real adapter in the real daemon reads what
the simulator says, through the same pynvml names as fakes/nvml_module.py.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import orjson
import pynvml

from fakes.gpus import H100_SXM
from fakes.nvml import fake_node

FAKE = fake_node(H100_SXM, count=int(os.environ.get("RACKGUARD_FAKE_GPUS", "8")))
_FEED = Path(os.environ.get("RACKGUARD_FAKE_GPU_FEED", "/nonexistent"))
_seen: list[tuple[int, int]] = [(0, 0)]
_TEMPERATURE = "nvmlDeviceGetTemperature"


def _refresh() -> None:
    try:
        st = _FEED.stat()
        if (st.st_ino, st.st_mtime_ns) == _seen[0]:
            return
        data = orjson.loads(_FEED.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return  # keep the last state: the writer replaces the file atomically
    _seen[0] = (st.st_ino, st.st_mtime_ns)
    for gpu, g in zip(FAKE.gpus, data.get("gpus", []), strict=False):
        gpu.temperature_c = float(g["t"])
        gpu.memory_temperature_c = float(g["m"])
        gpu.power_w = float(g["p"])
        gpu.follow_enforced(float(g["pl"]))
        gpu.clock_event_reasons = int(g["c"])
        if g.get("dropped"):
            gpu.errors[_TEMPERATURE] = pynvml.NVML_ERROR_UNKNOWN
        elif gpu.errors.get(_TEMPERATURE) == pynvml.NVML_ERROR_UNKNOWN:
            del gpu.errors[_TEMPERATURE]
        gpu.lost = gpu.lost or bool(g.get("lost"))


def nvmlDeviceGetTemperature(handle: Any, sensor: int) -> int:
    """The newest temperature the simulator wrote (pynvml's name)."""
    _refresh()
    return FAKE.nvmlDeviceGetTemperature(handle, sensor)


globals().update(
    {n: getattr(FAKE, n) for n in dir(FAKE) if not n.startswith("_") and n != _TEMPERATURE}
)


if __name__ == "__main__":
    from daemon.cli import main

    sys.exit(main(sys.argv[1:], nvml=sys.modules[__name__]))
