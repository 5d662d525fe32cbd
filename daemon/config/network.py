"""Which addresses only this machine can reach (the API's and etcd's checks share it)."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """True for an address (or 'localhost') that only this machine can reach."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
