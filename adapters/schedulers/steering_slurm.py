"""A Slurm node's ``Weight`` (lower is preferred by the scheduler), through scontrol.

- read: ``scontrol -o show node N`` (``Weight=1``);
- write: ``scontrol update NodeName=N Weight=W``.

Through the Slurm sink's own scontrol (its command, SLURM_CONF and timeout). Slurm
has no compare-and-set for a node update: the weight is read just before it is
written, and a value that differs from the expected one is left alone.

A weight set by scontrol lasts until slurmctld restarts without ``-R`` or runs
``scontrol reconfig``: the node then shows slurm.conf's weight again (the
original), which steering recognises as its own starting point and rewrites.
"""

from __future__ import annotations

import re

from adapters.base import DeliveryError
from adapters.schedulers.node_setting import SettingChanged
from adapters.schedulers.slurm import SlurmSink

_WEIGHT = re.compile(r"(?:^|\s)Weight=(\d+)(?:\s|$)")


def parse_weight(line: str) -> str | None:
    """The Weight of one ``scontrol -o show node`` line, or None when absent."""
    # The reason comes last and is free text: "Reason=maint Weight=3" is not a weight.
    m = _WEIGHT.search(line.split(" Reason=", 1)[0])
    return m.group(1) if m else None


class SlurmWeight:
    """The node's Weight; every call goes through the sink's scontrol."""

    target = "slurm weight"

    def __init__(self, sink: SlurmSink) -> None:
        self._sink = sink

    async def read(self, node: str) -> str | None:
        """The weight now (``"1"``); DeliveryError when scontrol fails or says nothing."""
        # The sink's runner: its scontrol, SLURM_CONF and timeout (private to
        # adapters/schedulers; the steering adapters are its neighbours).
        rc, out, err = await self._sink._scontrol_run("-o", "show", "node", node)
        if rc != 0:
            raise DeliveryError(f"{node}: scontrol show node: rc={rc}: {err or out}")
        weight = parse_weight(out)
        if weight is None:
            raise DeliveryError(f"{node}: scontrol show node printed no Weight: {out[:200]!r}")
        return weight

    async def write(self, node: str, value: str | None, expected: str | None) -> None:
        """Set the weight, after reading that it still is ``expected``."""
        if value is None or not value.isdigit():
            raise ValueError(f"a Slurm weight is a number, got {value!r}")
        now = await self.read(node)
        if now != expected:
            raise SettingChanged(f"{node}: Weight is {now}, not {expected}")
        rc, out, err = await self._sink._scontrol_run(
            "update", f"NodeName={node}", f"Weight={value}"
        )
        if rc != 0:
            raise DeliveryError(
                f"{node}: scontrol update Weight={value}: rc={rc}: {err or out}",
                permanent="invalid" in f"{err} {out}".lower(),
            )
