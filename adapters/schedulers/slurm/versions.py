"""slurmrestd's API versions: which one to speak, whether it can write nodes, node shapes.

Slurm 22.05 serves v0.0.36-v0.0.38 and can only read nodes (POST on a node is
405); Slurm 23.02 (v0.0.39) added ``POST /slurm/<v>/node/{node_name}``; 24.11
serves v0.0.40-v0.0.42. The server's OpenAPI document lists what it serves.

Node objects differ: up to v0.0.38 ``state`` is a string ("idle") with flags in
``state_flags`` (["DRAIN"]); from v0.0.39 on ``state`` is a list
(["IDLE", "DRAIN"]).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from adapters.schedulers.base import NodeView

_VERSION = re.compile(r"^/slurm/(v\d+\.\d+\.\d+)/")
NODE_WRITE_SINCE = (0, 0, 39)
# Running jobs through REST from Slurm 23.02 (v0.0.39) on, like node writes: the
# job list (GET /slurm/<v>/jobs/) and the signal (DELETE /slurm/<v>/job/{job_id}
# with ?signal= and ?flags=). 22.05 keeps squeue / scancel.
JOB_CONTROL_SINCE = (0, 0, 39)


def version_tuple(version: str) -> tuple[int, ...]:
    """``"v0.0.42"`` -> ``(0, 0, 42)``."""
    return tuple(int(p) for p in version.lstrip("v").split("."))


@dataclass(frozen=True, slots=True)
class ApiInfo:
    """What the server offers, from its OpenAPI document."""

    versions: tuple[str, ...]  # every slurmctld API version served, oldest first
    node_write: tuple[str, ...]  # the versions with POST /slurm/<v>/node/{node_name}
    job_control: tuple[str, ...] = ()  # >= v0.0.39 with GET jobs and DELETE job/{job_id}
    bulk_signal: tuple[str, ...] = ()  # DELETE /slurm/<v>/jobs/ (a kill_jobs_msg body)

    def pick(self, wanted: str | None = None) -> str:
        """The version to speak: ``wanted`` if served, else the newest."""
        if wanted:
            if wanted not in self.versions:
                served = ", ".join(self.versions) or "none"
                raise ValueError(f"slurmrestd does not serve {wanted} (it serves: {served})")
            return wanted
        if not self.versions:
            raise ValueError("slurmrestd serves no /slurm/<version>/ paths")
        return self.versions[-1]

    def can_write(self, version: str) -> bool:
        """True when nodes can be updated through REST at ``version``."""
        return version in self.node_write

    def can_signal(self, version: str) -> bool:
        """True when running jobs can be listed and signalled through REST at ``version``."""
        return version in self.job_control


def api_info(spec: Mapping[str, Any]) -> ApiInfo:
    """Parse an OpenAPI document (``GET /openapi/v3``)."""
    paths = spec.get("paths", {})
    versions: set[str] = set()
    writable: set[str] = set()
    job_list: set[str] = set()
    job_signal: set[str] = set()
    bulk: set[str] = set()
    for path, methods in paths.items():
        m = _VERSION.match(path)
        if not m or not isinstance(methods, Mapping):
            continue
        version = m.group(1)
        versions.add(version)
        rest = path.removeprefix(f"/slurm/{version}/").rstrip("/")
        if rest.startswith("node/") and "post" in methods:
            writable.add(version)
        if rest == "jobs" and "get" in methods:
            job_list.add(version)
        if rest == "jobs" and "delete" in methods:
            bulk.add(version)
        if rest == "job/{job_id}" and "delete" in methods:
            job_signal.add(version)
    jobs = {v for v in job_list & job_signal if version_tuple(v) >= JOB_CONTROL_SINCE}
    return ApiInfo(_sorted(versions), _sorted(writable), _sorted(jobs), _sorted(bulk & jobs))


def _sorted(versions: Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted(versions, key=version_tuple))


def node_states(node: Mapping[str, Any]) -> list[str]:
    """Base state and flags, upper case: ["IDLE", "DRAIN"], whatever the API version."""
    state = node.get("state", [])
    words = [state] if isinstance(state, str) else list(state or [])
    words += list(node.get("state_flags") or [])
    return [str(w).upper() for w in words if w]


def node_view(node: Mapping[str, Any]) -> NodeView:
    """The normalised view of one node object of any API version."""
    states = node_states(node)
    reason = node.get("reason") or ""
    return NodeView(
        node=str(node.get("name", "")),
        drained="DRAIN" in states,
        down="DOWN" in states,
        reason=str(reason),
        detail="+".join(states),
    )


def slurm_errors(body: Mapping[str, Any]) -> list[tuple[int, str]]:
    """``errors`` of a slurmrestd response as (error_number, text) pairs."""
    out = []
    for e in body.get("errors") or []:
        if isinstance(e, Mapping):
            num = e.get("error_number", e.get("errno", 0))
            text = e.get("error") or e.get("description") or ""
            desc = e.get("description") or ""
            if desc and desc != text:
                text = f"{text} ({desc})"
            out.append((int(num or 0), str(text)))
    return out


# Slurm error numbers that retrying cannot fix, and what they mean for us.
PERMANENT_ERRORS = {
    2010: "the token's user is not a Slurm administrator (SlurmUser or AdminLevel)",
    2018: "Slurm does not know this node",
    2028: "Slurm refused this state change for the node's current state",
    9207: "slurmrestd could not parse the requested state",
}
