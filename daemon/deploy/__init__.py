"""Files an operator installs beside the agent, shipped inside the package.

The unit and the example config live in the repository's systemd/ (the layout the
project keeps); the links to them here put them in the wheel.

`rackguard files` lists them with their installed paths; `rackguard files NAME`
prints one, so a node needs no checkout of the repository (docs/operations.md).
"""

from __future__ import annotations

from importlib import resources
from importlib.abc import Traversable

# name -> (path inside this package, what it is)
FILES: dict[str, tuple[str, str]] = {
    "unit": ("rackguard.service", "systemd unit (/etc/systemd/system/rackguard.service)"),
    "config": ("rackguard.example.toml", "example config, every key documented"),
    "cap-socket": (
        "rackguard-powercap.socket",
        "power-cap helper socket (/etc/systemd/system/rackguard-powercap.socket)",
    ),
    "cap-unit": (
        "rackguard-powercap.service",
        "power-cap helper unit (/etc/systemd/system/rackguard-powercap.service)",
    ),
    "alerts": ("prometheus/rackguard-alerts.yml", "Prometheus alert rules"),
    "dashboard": ("grafana/rackguard-dashboard.json", "Grafana dashboard (fleet and node)"),
    "kubernetes": ("kubernetes/rackguard.yaml", "DaemonSet, ServiceAccount and RBAC"),
}


def deploy_file(name: str) -> Traversable:
    """The packaged file called ``name`` (a key of FILES); KeyError for an unknown name."""
    relative, _ = FILES[name]
    return resources.files(__package__).joinpath(relative)
