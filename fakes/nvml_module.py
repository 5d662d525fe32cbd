"""A simulated node of eight H100 SXM GPUs at rest (``RACKGUARD_FAKE_GPUS=N`` for N).

Runs the real `rackguard` command with the real NVML adapter bound to this fake
NVML, for the tests and for a shell on a machine with no GPU::

    python -m fakes.nvml_module run --config rackguard.toml
    python -m fakes.nvml_module probe gpus --config rackguard.toml
    python -m fakes.nvml_module powercap-helper --socket /run/rackguard/powercap.sock

The config cannot select it (``binding`` names nvidia-ml-py's ``pynvml`` only):
a production node never watches simulated GPUs by a typo. The daemon logs a
WARNING at start and shows ``"simulated": true`` in /v1/state and /readyz.

``RACKGUARD_FAKE_TEMP_FILE`` names a file holding one number: every GPU's core
temperature, re-read every 50 ms, so a test can heat and cool the node of a
daemon running in another process.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time

from fakes.gpus import H100_SXM
from fakes.nvml import FakeNvml, fake_node


def simulated_node() -> FakeNvml:
    """The resting node this module runs against (following the temperature file if set)."""
    fake = fake_node(H100_SXM, count=int(os.environ.get("RACKGUARD_FAKE_GPUS", "8")))
    fake.privileged = os.geteuid() == 0  # like NVML: only root may set a power limit
    for i, gpu in enumerate(fake.gpus):
        gpu.temperature_c = 41.0 + i % 3
        gpu.memory_temperature_c = 48.0 + i % 2
        gpu.power_w = 110.0 + 3 * i
    path = os.environ.get("RACKGUARD_FAKE_TEMP_FILE")
    if path:
        threading.Thread(
            target=_follow_temperature, args=(fake, path), name="fake-temp", daemon=True
        ).start()
    return fake


def _follow_temperature(fake: FakeNvml, path: str) -> None:
    while True:
        try:
            with open(path) as fh:
                value = float(fh.read().strip() or "nan")
        except (OSError, ValueError):
            value = float("nan")
        if not math.isnan(value):
            for gpu in fake.gpus:
                gpu.temperature_c = value
        time.sleep(0.05)


if __name__ == "__main__":
    from daemon.cli import main

    sys.exit(main(sys.argv[1:], nvml=simulated_node()))
