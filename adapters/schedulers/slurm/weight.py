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

Slurm's limits (22.05, ``src/scontrol/update_node.c``): a weight is 0 to
0xfffffff0 (4294967280); above that ``scontrol update`` answers "Weight value
(4294967281) is greater than 4294967280" (rc 1; seen on 22.05.8).
``Weight=INFINITE`` (an administrator's, shown as 4294967295) is a value
rackguard never writes and so could never restore: ``writable`` says so, and
steering leaves such a node alone.

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

_WEIGHT = re.compile(r"(?:^|\s)Weight=(\d+|INFINITE)(?:\s|$)")
SLURM_MAX_WEIGHT = 0xFFFFFFF0  # 4294967280: the largest weight scontrol sets
INFINITE = str(0xFFFFFFFF)  # 4294967295: how scontrol and slurmrestd show Weight=INFINITE


def parse_weight(line: str) -> str | None:
    """The Weight of one ``scontrol -o show node`` line, or None when absent."""
    # The reason comes last and is free text: "Reason=maint Weight=3" is not a weight.
    m = _WEIGHT.search(line.split(" Reason=", 1)[0])
    if m is None:
        return None
    return INFINITE if m.group(1) == "INFINITE" else m.group(1)


def rest_weight(raw: Any) -> str | None:
    """A node object's weight (an integer, or a set uint32_no_val), or None."""
    if isinstance(raw, dict):
        if raw.get("infinite") is True:
            return INFINITE
        if not raw.get("set", True):
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

    def writable(self, value: str | None) -> bool:
        """Whether scontrol (and slurmrestd) would set this weight: 0 to 4294967280."""
        return value is not None and value.isdigit() and int(value) <= SLURM_MAX_WEIGHT

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
        if not self.writable(value):
            raise DeliveryError(
                f"{node}: Weight={value} is not one Slurm sets (0 to {SLURM_MAX_WEIGHT})",
                final=True,
                reason="invalid",
            )
        assert value is not None
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
            said = f"{err} {out}".lower()
            # "Weight value (N) is greater than 4294967280", "Invalid node name specified".
            refused = any(w in said for w in ("invalid", "not a valid", "is greater than"))
            raise DeliveryError(
                f"{node}: scontrol update Weight={value}: rc={rc}: {err or out}",
                permanent=refused,
                reason="invalid" if refused else "",
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
