"""The [cluster] table: how this agent learns about the rest of the fleet (docs/fleet.md)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from daemon.config.typed_toml import bounded

Problems = Iterator[tuple[str, str]]


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """The scheduler-fed cluster view and, optionally, etcd for atomic claims."""

    # Read every node from the scheduler this often (0: off, the agent's own ledger).
    view_interval_s: float = bounded(10.0, ge=0, le=3600)
    # Rack membership where the scheduler does not say (feature rack_<name> / label
    # topology.rackguard.io/rack): rack name -> node names.
    racks: dict[str, list[str]] = field(default_factory=dict)
    # etcd v3 endpoints ("http://10.0.0.5:2379"); empty: no claims.
    etcd: list[str] = field(default_factory=list)
    etcd_prefix: str = "/rackguard/"
    lease_ttl_s: int = bounded(10, ge=2, le=300)
    claim_timeout_s: float = bounded(1.0, gt=0, le=10)
    # Full node reads per second the whole fleet may ask of the scheduler when each
    # agent reads for itself (no etcd, or etcd away): an agent reads every
    # max(view_interval_s, fleet size / this) seconds (docs/fleet.md).
    view_budget_reads_per_s: float = bounded(0.5, gt=0, le=1000)

    def validate(self) -> Problems:
        """Endpoints are URLs, the prefix a directory, a claim shorter than the lease."""
        for i, url in enumerate(self.etcd):
            if not url.startswith(("http://", "https://")):
                yield f"etcd[{i}]", f"must be an http:// or https:// URL, got {url!r}"
        if not (self.etcd_prefix.startswith("/") and self.etcd_prefix.endswith("/")):
            yield "etcd_prefix", f"must start and end with '/', got {self.etcd_prefix!r}"
        if self.claim_timeout_s >= self.lease_ttl_s:
            yield "claim_timeout_s", "must be shorter than lease_ttl_s"
        seen: dict[str, str] = {}
        for rack, nodes in sorted(self.racks.items()):
            for node in nodes:
                if node in seen:
                    yield f"racks.{rack}", f"node {node!r} is already in rack {seen[node]!r}"
                seen[node] = rack

    def rack_of(self) -> dict[str, str]:
        """Node -> rack, from ``racks``."""
        return {n: r for r, nodes in self.racks.items() for n in nodes}
