"""Slurm sink: drain / down / resume nodes through slurmrestd, or ``scontrol`` on Slurm 22.05.

- Reads: ``GET /slurm/<v>/node/{name}`` (one node) or ``GET /slurm/<v>/nodes``.
  Without a REST URL, ``scontrol -o show node``.
- Writes: ``POST /slurm/<v>/node/{name}`` with ``{"state": ["DRAIN"], "reason": ...}``
  where the server offers it (Slurm >= 23.02, v0.0.39 on); otherwise
  ``scontrol update nodename=N state=drain reason=...`` (``write_via``).
- Transport, auth and API version: the backend's SlurmClient (client.py).

Slurm's error numbers become clear errors; those retrying cannot fix (2010 not
an admin, 2018 unknown node, 2028 invalid state) are permanent. The sink does
not decide whether a node may be touched: the outbox reads the node first and
leaves nodes held by someone else alone.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from adapters.base import DeliveryError, http_error
from adapters.schedulers.base import (
    EXCLUDE_STATE_DEFAULT,
    ExcludeState,
    NodeReadError,
    NodeView,
)
from adapters.schedulers.listing import ListedNode
from adapters.schedulers.slurm.client import SlurmClient
from adapters.schedulers.slurm.listing import listed_scontrol, listed_slurm
from adapters.schedulers.slurm.reason import split_reason
from adapters.schedulers.slurm.versions import PERMANENT_ERRORS, node_view, slurm_errors
from policies.model import Action, Decision
from policies.safety import scheduler_reason

log = logging.getLogger(__name__)

# Metric labels of the refusals an operator fixes (others are "refused").
_ERROR_REASON = {2010: "auth", 2018: "not_found"}
SLURM_STATE = {Action.DRAIN: "DRAIN", Action.EXCLUDE: "DOWN", Action.RESUME: "RESUME"}
# ``scontrol -o show nodes`` is ~570 bytes a node: 10,000 nodes are 5.7 MB. A list
# past this is refused whole, never read cut.
NODE_LIST_LIMIT = 64 * 1024 * 1024


class SlurmSink:
    """Delivers decisions to Slurm and reads nodes back, through the backend's client."""

    def __init__(
        self, client: SlurmClient, *, exclude_state: ExcludeState = EXCLUDE_STATE_DEFAULT
    ) -> None:
        self.name = "slurm"
        self.client = client
        # "drain": an exclusion drains (running jobs are told and requeued by the
        # job notices); "down": Slurm kills the node's running jobs at once.
        self.exclude_down = exclude_state == "down"
        self._states = dict(SLURM_STATE)
        if not self.exclude_down:
            self._states[Action.EXCLUDE] = "DRAIN"

    # ------------------------------------------------------------------ reads

    async def read_state(self, nodes: Sequence[str]) -> dict[str, NodeView]:
        """Each node's state and reason; an unknown node has exists=False."""
        try:
            if self.client.url is None:
                return await self._read_scontrol(nodes)
            return await self._read_rest(nodes)
        except DeliveryError as err:
            raise NodeReadError(str(err), permanent=err.permanent) from err

    async def _read_rest(self, nodes: Sequence[str]) -> dict[str, NodeView]:
        version = await self.client.ensure_api()
        if len(nodes) == 1:
            status, body = await self.client.request("GET", f"/slurm/{version}/node/{nodes[0]}")
        else:
            status, body = await self.client.request("GET", f"/slurm/{version}/nodes")
        if not isinstance(body, dict):
            raise DeliveryError(f"slurmrestd GET nodes: HTTP {status}: {str(body)[:200]}")
        errors = slurm_errors(body)
        # Only Slurm's own "invalid node name" (2018) means the node does not
        # exist; a bare 404 may be a proxy or an API version slurmrestd dropped
        # after an upgrade: detect the version again and retry, never give up.
        unknown = any(num == 2018 for num, _ in errors)
        if status == 404 and not unknown:
            self.client.forget_version()
            raise DeliveryError(
                f"slurmrestd GET nodes: HTTP 404 without Slurm error 2018: "
                f"{_error_text(errors, body)}; detecting the API version again"
            )
        if status != 200 and not unknown:
            raise DeliveryError(f"slurmrestd GET nodes: HTTP {status}: {_error_text(errors, body)}")
        seen = {v.node: v for v in map(node_view, body.get("nodes") or [])}
        return {n: seen.get(n, NodeView(n, exists=False)) for n in nodes}

    async def list_nodes(self) -> list[ListedNode]:
        """Every node in one read (``GET /nodes`` or ``scontrol -o show nodes``)."""
        try:
            if self.client.url is None:
                rc, stdout, stderr = await self.client.scontrol(
                    "-o", "show", "nodes", limit=NODE_LIST_LIMIT
                )
                if rc != 0:
                    raise DeliveryError(f"scontrol show nodes: rc={rc}: {stderr}")
                lines = [ln for ln in stdout.splitlines() if ln.startswith("NodeName=")]
                return [
                    listed_scontrol(ln, parse_scontrol_node(ln) or NodeView("")) for ln in lines
                ]
            version = await self.client.ensure_api()
            status, body = await self.client.request("GET", f"/slurm/{version}/nodes")
            if status != 200 or not isinstance(body, dict):
                raise DeliveryError(f"slurmrestd GET nodes: HTTP {status}: {str(body)[:200]}")
            raw = [n for n in body.get("nodes") or [] if isinstance(n, dict)]
            return [listed_slurm(n, node_view(n)) for n in raw]
        except DeliveryError as err:
            raise NodeReadError(str(err), permanent=err.permanent) from err

    async def _read_scontrol(self, nodes: Sequence[str]) -> dict[str, NodeView]:
        out: dict[str, NodeView] = {}
        for node in nodes:
            rc, stdout, stderr = await self.client.scontrol("-o", "show", "node", node)
            if rc != 0:
                said = f"{stdout} {stderr}".lower()  # "Node gpu99 not found" is on stdout
                if "not found" in said or "invalid node name" in said:
                    out[node] = NodeView(node, exists=False)
                    continue
                raise DeliveryError(f"scontrol show node {node}: rc={rc}: {stderr}")
            out[node] = parse_scontrol_node(stdout) or NodeView(node, exists=False)
        return out

    # ------------------------------------------------------------------ writes

    async def deliver(self, decision: Decision) -> None:
        """Ask Slurm for the decision's state; return once Slurm accepted it."""
        version = ""
        if self.client.url is not None:
            version = await self.client.ensure_api()
            if self.client.write_via == "rest" and not self.client.rest_writes:
                raise DeliveryError(
                    f"slurmrestd {version} cannot update nodes (Slurm < 23.02); "
                    "set write_via = 'scontrol'",
                    permanent=True,
                )
        if self.client.rest_writes:
            await self._write_rest(decision, version)
        else:
            await self._write_scontrol(decision)

    async def _write_rest(self, decision: Decision, version: str) -> None:
        state = self._states[decision.action]
        body: dict[str, Any] = {"state": [state]}
        if decision.action is not Action.RESUME:
            body["reason"] = scheduler_reason(decision)
        path = f"/slurm/{version}/node/{decision.node}"
        status, resp = await self.client.request("POST", path, body)
        errors = slurm_errors(resp) if isinstance(resp, dict) else []
        if status == 200 and not errors:
            return
        known = [(n, t) for n, t in errors if n in PERMANENT_ERRORS]
        if known:
            num, text = known[-1]
            raise DeliveryError(
                f"{decision.node}: Slurm error {num} on {state}: {text}: {PERMANENT_ERRORS[num]}",
                permanent=True,
                reason=_ERROR_REASON.get(num, "refused"),
            )
        if status == 405:
            raise DeliveryError(
                f"slurmrestd at {version} cannot update nodes (HTTP 405); "
                "set write_via = 'scontrol'",
                permanent=True,
            )
        text = _error_text(errors, resp)
        raise http_error(f"{decision.node}: {state} via slurmrestd: HTTP {status}: {text}", status)

    async def _write_scontrol(self, decision: Decision) -> None:
        state = self._states[decision.action]
        args = ["update", f"nodename={decision.node}", f"state={state.lower()}"]
        if decision.action is not Action.RESUME:
            args.append(f"reason={scheduler_reason(decision)}")
        rc, _, stderr = await self.client.scontrol(*args)
        if rc == 0:
            return
        low = stderr.lower()
        if "invalid node name" in low:
            num = 2018
        elif "invalid node state" in low:
            if decision.action is Action.RESUME:
                # 22.05 answers a resume of a node without a live slurmd this way
                # yet clears the drain: the outbox's read-back decides.
                log.debug("%s: scontrol resume said %r; reading back", decision.node, stderr)
                return
            num = 2028
        elif "invalid user" in low or ("access" in low and "denied" in low):
            num = 2010
        else:
            raise DeliveryError(
                f"{decision.node}: scontrol update state={state}: rc={rc}: {stderr}"
            )
        raise DeliveryError(
            f"{decision.node}: scontrol update state={state}: {stderr}: {PERMANENT_ERRORS[num]}",
            permanent=True,
            reason=_ERROR_REASON.get(num, "refused"),
        )

    async def close(self) -> None:
        """Close the client's HTTP session."""
        await self.client.close()


def _error_text(errors: list[tuple[int, str]], body: Any) -> str:
    text = "; ".join(f"error {n}: {t}" for n, t in errors) or str(body)[:200]
    if errors and all(n == -1 for n, _ in errors):
        text += " (Slurm 22.05 answers a refused JWT this way: check the token and its user)"
    return text


def parse_scontrol_node(text: str) -> NodeView | None:
    """A node from ``scontrol -o show node`` (one line of Key=Value; Reason= may be followed
    by Comment= and Extra=)."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    if not line.startswith("NodeName="):
        return None
    split = split_reason(line)
    fields = dict(f.split("=", 1) for f in split.head.split() if "=" in f)
    states = [s for s in fields.get("State", "").upper().split("+") if s]
    return NodeView(
        node=fields["NodeName"],
        drained="DRAIN" in states,
        down=any(s.startswith("DOWN") for s in states),
        reason=split.reason,
        detail="+".join(states),
    )
