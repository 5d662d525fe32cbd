"""Checks that need the machine, not just the file: shared by `check-config` and `run`.

Whatever `run` would refuse at start, `check-config` refuses too (exit 2, the key).
"""

from __future__ import annotations

import errno
import http.client
import importlib.util
import socket

import orjson

from daemon.config import Config, NvmlSourceConfig

NVML_MODULE = "pynvml"


def preflight_problems(config: Config, *, nvml_injected: bool = False) -> list[str]:
    """Each problem as ``key.path: message``; empty when the node can run this config."""
    problems: list[str] = []
    if not nvml_injected:
        for name, cfg in config.sources.items():
            if isinstance(cfg, NvmlSourceConfig) and importlib.util.find_spec(NVML_MODULE) is None:
                problems.append(
                    f"sources.{name}.binding: the NVML binding {NVML_MODULE!r} is not installed:"
                    " pip install nvidia-ml-py into rackguard's virtual environment"
                )
    problem = listen_problem(config.api.listen, config.api.port)
    if problem:
        problems.append(problem)
    return problems


def listen_problem(host: str, port: int) -> str | None:
    """Why the API could not listen on host:port (unresolvable, in use, not ours), or None."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as err:
        return f"api.listen: cannot resolve {host!r}: {getattr(err, 'strerror', None) or err}"
    if port == 0:
        return None  # any free port: nothing to hold
    for family, kind, proto, _, address in infos:
        with socket.socket(family, kind, proto) as probe:
            # As aiohttp binds: a port in TIME_WAIT is usable, one with a listener is not.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as err:
                if err.errno == errno.EADDRINUSE and _is_rackguard(family, host, port):
                    # The running agent itself (check-config before a restart):
                    # the port is free again once it stops.
                    return None
                return f"api.port: cannot listen on {host}:{port}: {err.strerror or err}"
    return None


def _is_rackguard(family: int, host: str, port: int) -> bool:
    """Whether a rackguard API answers on host:port (its /openapi.json says so)."""
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    elif family == socket.AF_INET6 and ":" in host:
        host = f"[{host}]"
    conn = http.client.HTTPConnection(host, port, timeout=1.0)
    try:
        conn.request("GET", "/openapi.json")
        resp = conn.getresponse()
        body = orjson.loads(resp.read(1 << 20)) if resp.status == 200 else None
    except (OSError, http.client.HTTPException, orjson.JSONDecodeError):
        return False
    finally:
        conn.close()
    if not isinstance(body, dict):
        return False
    info = body.get("info")
    return isinstance(info, dict) and info.get("title") == "rackguard"
