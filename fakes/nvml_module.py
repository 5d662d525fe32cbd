"""A module-shaped fake NVML, for ``binding = "fakes.nvml_module"`` in a config file.

Lets `rackguard run` and `rackguard probe` run from a shell on a machine with no
GPU: one node of eight H100 SXM GPUs at rest (or ``RACKGUARD_FAKE_GPUS=N``).
Every attribute of a FakeNvml instance becomes a module attribute, so the real
adapter sees the same names as in nvidia-ml-py's ``pynvml`` module.
"""

from __future__ import annotations

import math
import os
import threading
import time

from fakes.gpus import H100_SXM
from fakes.nvml import fake_node

FAKE = fake_node(H100_SXM, count=int(os.environ.get("RACKGUARD_FAKE_GPUS", "8")))
for _i, _gpu in enumerate(FAKE.gpus):
    _gpu.temperature_c = 41.0 + _i % 3
    _gpu.memory_temperature_c = 48.0 + _i % 2
    _gpu.power_w = 110.0 + 3 * _i

globals().update({name: getattr(FAKE, name) for name in dir(FAKE) if not name.startswith("_")})

# RACKGUARD_FAKE_TEMP_FILE names a file holding one number: every GPU's core
# temperature, re-read every 50 ms, so a test can heat and cool the node of a
# daemon running in another process.
_TEMP_FILE = os.environ.get("RACKGUARD_FAKE_TEMP_FILE")


def _follow_temperature(path: str) -> None:
    while True:
        try:
            with open(path) as fh:
                value = float(fh.read().strip() or "nan")
        except (OSError, ValueError):
            value = float("nan")
        if not math.isnan(value):
            for gpu in FAKE.gpus:
                gpu.temperature_c = value
        time.sleep(0.05)


if _TEMP_FILE:
    threading.Thread(
        target=_follow_temperature, args=(_TEMP_FILE,), name="fake-temp", daemon=True
    ).start()
