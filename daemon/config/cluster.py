"""The [cluster] table: how this agent learns about the rest of the fleet (docs/fleet.md)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from daemon.config.network import is_loopback
from daemon.config.secrets import resolve_secret, secret_problem
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
    # etcd as production runs it (docs/fleet.md, "etcd with TLS and authentication").
    # TLS: the CA that signed etcd's certificate (https:// endpoints; default: the
    # system's), and our client certificate and key for --client-cert-auth. Files
    # or systemd credentials, like every secret.
    etcd_ca_file: Path | None = None
    etcd_cert_file: Path | None = None
    etcd_key_file: Path | None = None
    # etcd's own authentication: a user whose role may read and write etcd_prefix only.
    etcd_user: str = ""
    etcd_password_file: Path | None = None
    # A plain http:// endpoint that is not loopback is refused unless this says,
    # explicitly, that anyone on the network may claim slots and trip the breaker.
    etcd_insecure: bool = False
    # Full node reads per second the whole fleet may ask of the scheduler when each
    # agent reads for itself (no etcd, or etcd away): an agent reads every
    # max(view_interval_s, fleet size / this) seconds (docs/fleet.md).
    view_budget_reads_per_s: float = bounded(0.5, gt=0, le=1000)

    def validate(self) -> Problems:
        """URLs (TLS off loopback), usable TLS files, the prefix, a claim shorter than a lease."""
        for i, url in enumerate(self.etcd):
            if not url.startswith(("http://", "https://")):
                yield f"etcd[{i}]", f"must be an http:// or https:// URL, got {url!r}"
            elif (
                url.startswith("http://")
                and not self.etcd_insecure
                and not is_loopback(urlsplit(url).hostname or "")
            ):
                yield (
                    f"etcd[{i}]",
                    f"{url!r} is plain HTTP to another machine: anyone on the path may claim"
                    " slots or trip the breaker; use https:// (etcd_ca_file, etcd_cert_file,"
                    " etcd_key_file), or set etcd_insecure = true to accept that",
                )
        yield from self._tls_problems()
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

    def _tls_problems(self) -> Problems:
        files = {
            "etcd_ca_file": (self.etcd_ca_file, False),
            "etcd_cert_file": (self.etcd_cert_file, False),
            "etcd_key_file": (self.etcd_key_file, True),
            "etcd_password_file": (self.etcd_password_file, True),
        }
        for key, (path, private) in files.items():
            if path is not None:
                problem = secret_problem(resolve_secret(path), private=private)
                if problem:
                    yield key, problem
        if (self.etcd_cert_file is None) != (self.etcd_key_file is None):
            yield "etcd_key_file", "etcd_cert_file and etcd_key_file go together"
        tls = self.etcd_ca_file or self.etcd_cert_file
        if tls and not any(u.startswith("https://") for u in self.etcd):
            yield "etcd", "etcd_ca_file/etcd_cert_file are set but no endpoint is https://"
        if bool(self.etcd_user) != (self.etcd_password_file is not None):
            yield "etcd_password_file", "etcd_user and etcd_password_file go together"

    def rack_of(self) -> dict[str, str]:
        """Node -> rack, from ``racks``."""
        return {n: r for r, nodes in self.racks.items() for n in nodes}


def _local(url: str) -> bool:
    return is_loopback(urlsplit(url).hostname or "")
