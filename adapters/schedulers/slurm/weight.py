"""A Slurm node's ``Weight`` (lower is preferred by the scheduler), through the Slurm client.

- read: ``GET /slurm/<v>/node/{name}`` (``"weight": 1``, or a uint32_no_val
  ``{"set", "infinite", "number"}``) where a REST URL is set; else
  ``scontrol -o show node N`` (``Weight=1``);
- write: ``POST /slurm/<v>/node/{name}`` with ``{"weight": {"set": true,
  "infinite": false, "number": W}}`` (update_node_msg's uint32_no_val, v0.0.39
  on) where the sink writes through REST (Slurm >= 23.02); else ``scontrol
  update NodeName=N Weight=W``.

Through the backend's one Slurm client (the sink's session, token, API
version, scontrol, SLURM_CONF and timeout). Slurm has no compare-and-set for a node
update: the weight is read just before it is written, and a value that differs
from the expected one is left alone.

A weight set by scontrol lasts until slurmctld restarts without ``-R`` or runs
``scontrol reconfig``: the node then shows slurm.conf's weight again (the
original), which steering recognises as its own starting point and rewrites.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from adapters.base import DeliveryError, http_error
from adapters.schedulers.node_setting import SettingChanged
from adapters.schedulers.slurm.client import SlurmClient
from adapters.schedulers.slurm.versions import slurm_errors

_WEIGHT = re.compile(r"(?:^|\s)Weight=(\d+)(?:\s|$)")


def parse_weight(line: str) -> str | None:
    """The Weight of one ``scontrol -o show node`` line, or None when absent."""
    # The reason comes last and is free text: "Reason=maint Weight=3" is not a weight.
    m = _WEIGHT.search(line.split(" Reason=", 1)[0])
    return m.group(1) if m else None


def rest_weight(raw: Any) -> str | None:
    """A node object's weight (an integer, or a set uint32_no_val), or None."""
    if isinstance(raw, dict):
        if not raw.get("set", True) or raw.get("infinite"):
            return None
        raw = raw.get("number")
    if isinstance(raw, bool) or not isinstance(raw, int):
        return None
    return str(raw)


class SlurmWeight:
    """The node's Weight, read and written through the Slurm client."""

    target = "slurm weight"

    def __init__(self, client: SlurmClient) -> None:
        self._client = client

    def value(self, bucket: int, weights: Sequence[int]) -> str:
        """The bucket's configured weight."""
        return str(weights[bucket])

    async def read(self, node: str) -> str | None:
        """The weight now (``"1"``); DeliveryError when Slurm cannot be read or says nothing."""
        if self._client.rest:
            return await self._read_rest(node)
        rc, out, err = await self._client.scontrol("-o", "show", "node", node)
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
        if self._client.rest:
            version = await self._client.ensure_api()
            if self._client.rest_writes:
                await self._write_rest(node, version, int(value))
                return
        rc, out, err = await self._client.scontrol("update", f"NodeName={node}", f"Weight={value}")
        if rc != 0:
            raise DeliveryError(
                f"{node}: scontrol update Weight={value}: rc={rc}: {err or out}",
                permanent="invalid" in f"{err} {out}".lower(),
            )

    async def _read_rest(self, node: str) -> str:
        version = await self._client.ensure_api()
        status, body = await self._client.request("GET", f"/slurm/{version}/node/{node}")
        nodes = body.get("nodes") if isinstance(body, dict) else None
        if status != 200 or not nodes or not isinstance(nodes[0], dict):
            raise http_error(
                f"{node}: slurmrestd GET node: HTTP {status}: {str(body)[:200]}", status
            )
        weight = rest_weight(nodes[0].get("weight"))
        if weight is None:
            raise DeliveryError(
                f"{node}: slurmrestd's node has no weight: {nodes[0].get('weight')!r}"
            )
        return weight

    async def _write_rest(self, node: str, version: str, weight: int) -> None:
        body = {"weight": {"set": True, "infinite": False, "number": weight}}
        status, resp = await self._client.request("POST", f"/slurm/{version}/node/{node}", body)
        errors = slurm_errors(resp) if isinstance(resp, dict) else []
        if status == 200 and not errors:
            return
        text = "; ".join(f"error {n}: {t}" for n, t in errors) or str(resp)[:200]
        raise http_error(f"{node}: Weight={weight} via slurmrestd: HTTP {status}: {text}", status)
