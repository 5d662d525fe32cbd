"""Property: whatever check-config accepts, `run` starts and reaches ready.

Mutated copies of the shipped example config (one or two keys changed to an
arbitrary value) go through the real `check-config`; each accepted one is run
as `run` runs it, with the NVML source on the simulated node, until /readyz
would say ready. A config that passes the check but cannot run is a parity bug.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import tempfile
import tomllib
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from daemon.app import Daemon
from daemon.cli import main
from daemon.config import load_config
from fakes.nvml_module import simulated_node
from tests.support.paths import ROOT

EXAMPLE = tomllib.loads((ROOT / "systemd" / "rackguard.example.toml").read_text())
# Readiness waits for each source's first attempt, scheduled within one
# interval: a long interval is valid but would make this test wait that long.
MAX_TEST_INTERVAL_S = 3.0


def leaves(table: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for key, value in table.items():
        if isinstance(value, dict):
            out += leaves(value, (*prefix, key))
        else:
            out.append((*prefix, key))
    return out


# The port stays 0: a fixed one could be taken by another process between the
# check and the run, which is a race, not a parity bug.
PATHS = [p for p in leaves(EXAMPLE) if p != ("api", "port")]


def _lookup(path: tuple[str, ...]) -> Any:
    value: Any = EXAMPLE
    for key in path:
        value = value[key]
    return value


def like(original: Any) -> st.SearchStrategy[Any]:
    """Values of the original's type, near it and at its edges (most configs go wrong so)."""
    if isinstance(original, bool):
        return st.booleans()
    if isinstance(original, int):
        return st.integers(-2, 1_000) | st.sampled_from([0, 1, original * 2, original * 100])
    if isinstance(original, float):
        scaled = st.sampled_from([0.0, 0.001, 0.1, 0.5, 2.0, 10.0, 1e6]).map(lambda k: original * k)
        return scaled | st.floats(allow_nan=True, allow_infinity=True) | st.floats(-1.0, 1.0)
    if isinstance(original, str):
        return st.text(max_size=12) | st.sampled_from(["", " ", "info", "debug", "127.0.0.2"])
    return st.lists(st.integers(-2, 10), max_size=4)


values = st.one_of(
    st.integers(-5, 100_000),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 0.0, 0.001, 0.04, 0.05, 0.5, 1e300, -1.0, True, False, "", "x"]),
    st.text(max_size=12),
    st.lists(st.integers(-2, 10), max_size=4),
)


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a TOML basic string
    return "[" + ", ".join(toml_value(v) for v in value) + "]"


def toml_text(data: dict[str, Any]) -> str:
    lines: list[str] = []

    def emit(table: dict[str, Any], name: str) -> None:
        scalars = {k: v for k, v in table.items() if not isinstance(v, dict)}
        if name:
            lines.append(f"[{name}]")
        lines.extend(f'"{k}" = {toml_value(v)}' for k, v in scalars.items())
        for k, v in table.items():
            if isinstance(v, dict):
                emit(v, f"{name}.{k}" if name else k)

    emit(data, "")
    return "\n".join(lines) + "\n"


def base_config(tmp: Path) -> dict[str, Any]:
    data: dict[str, Any] = _copy(EXAMPLE)
    secret = tmp / "webhook.key"
    secret.write_text("k\n")
    secret.chmod(0o600)
    data["api"]["port"] = 0
    data["scheduler"].update(
        url="http://127.0.0.1:9/none",
        secret_file=str(secret),
        outbox_path=str(tmp / "outbox.sqlite3"),
    )
    # Test-friendly timing; the mutations may still change any of it.
    data["sources"]["gpus"].update(interval_s=0.2, timeout_s=0.1)
    return data


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return list(value)
    return value


async def reaches_ready(path: Path) -> None:
    """What `run` does, with the simulated NVML, until ready; then a clean stop."""
    daemon = Daemon(load_config(path), config_path=path, nvml=simulated_node())
    await daemon.check_sources()
    task = asyncio.create_task(daemon.run(handle_signals=False))
    try:
        async with asyncio.timeout(MAX_TEST_INTERVAL_S * 2 + 10):
            await daemon.ready.wait()
    finally:
        daemon.stop()
        await task


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    mutations=st.lists(
        st.sampled_from(PATHS).flatmap(lambda p: st.tuples(st.just(p), like(_lookup(p)) | values)),
        min_size=1,
        max_size=2,
    ),
)
def test_what_check_config_accepts_runs_to_ready(
    mutations: list[tuple[tuple[str, ...], Any]],
) -> None:
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        data = base_config(tmp)
        for path, value in mutations:
            table = data
            for key in path[:-1]:
                table = table[key]
            table[path[-1]] = value
        cfg = tmp / "rg.toml"
        cfg.write_text(toml_text(data))
        cwd = Path.cwd()
        os.chdir(tmp)  # relative paths (record_trace = "x") land in the scratch directory
        try:
            if main(["check-config", str(cfg)], nvml=simulated_node()) != 0:
                event("refused by check-config")
                return  # refused, naming the key: nothing to run
            intervals = [s.interval_s for s in load_config(cfg).sources.values()]
            assume(max(intervals) <= MAX_TEST_INTERVAL_S)
            event("accepted: run to ready")
            asyncio.run(reaches_ready(cfg))
        finally:
            os.chdir(cwd)
