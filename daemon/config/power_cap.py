"""The [power_cap] table: how rackguard reaches the GPUs' power limits (off by default).

Setting a limit needs root; the daemon does not have it. ``via = "helper"`` asks
the privileged helper on its socket (systemd/rackguard-powercap.socket);
``via = "direct"`` calls NVML in the daemon, for a development box run as root.
See docs/operations.md, "Power capping".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from daemon.config.typed_toml import Problems, bounded

DEFAULT_HELPER_SOCKET = "/run/rackguard/powercap.sock"


@dataclass(frozen=True, slots=True)
class PowerCapConfig:
    """Whether caps may be set, through what, and whether only pretended."""

    enabled: bool = False
    via: Literal["helper", "direct"] = "helper"
    helper_socket: str = DEFAULT_HELPER_SOCKET
    # A request the helper has not answered within this is a transient failure.
    helper_timeout_s: float = bounded(10.0, gt=0, le=120)
    # Unset: the same as [policy] dry_run. Set, it overrides it for caps only.
    dry_run: bool | None = None
    # The ladder (policies/power_cap.py, docs/power-cap.md).
    cap_margin_c: float = bounded(8.0, gt=0, le=40, doc="hold a capped GPU this far under slowdown")
    settle_s: float = bounded(120.0, gt=0, doc="the forecast must turn within this, else drain")
    healthy_after_s: float = bounded(120.0, ge=0, doc="healthy this long before a restore step")
    restore_step_w: float = bounded(100.0, gt=0, doc="watts per restore step")
    restore_every_s: float = bounded(30.0, gt=0, doc="seconds between restore steps")
    budget_w: float = bounded(1.0e6, ge=0, doc="capped watts (before - cap), cluster-wide")
    storm_nodes: int = bounded(8, ge=1, doc="more nodes newly capped in storm_window_s: stop")
    storm_window_s: float = bounded(600.0, gt=0, doc="the cap storm window")

    def validate(self) -> Problems:
        """The helper socket is an absolute path."""
        if self.via == "helper" and not self.helper_socket.startswith("/"):
            yield "helper_socket", f"must be an absolute path, got {self.helper_socket!r}"

    def effective_dry_run(self, policy_dry_run: bool) -> bool:
        """Whether caps are only recorded: our own dry_run, else the policy's."""
        return policy_dry_run if self.dry_run is None else self.dry_run
