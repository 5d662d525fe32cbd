"""The `rackguard` command: run, check-config, probe, replay, powercap-helper.

The demo is not here: it runs on the simulator, which a production install does
not contain (`rackguard-sim demo`, from the development install).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import platform
import sys
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any

import orjson

from adapters.errors import SourceError, SourceMismatch
from adapters.timeouts import time_limit
from daemon.config import Config, ConfigError, config_notes, load_config
from daemon.replay import command as replay_cmd
from daemon.service.logs import setup_logging
from daemon.service.preflight import preflight_problems
from daemon.version import package_version

EXIT_CONFIG = 2
EXIT_STARTUP = 1


def run_async(coro: Coroutine[Any, Any, int]) -> int:
    """Run on uvloop when it is installed (faster I/O), else on asyncio's loop."""
    try:
        import uvloop  # noqa: PLC0415 - optional
    except ImportError:
        return asyncio.run(coro)
    result: int = uvloop.run(coro)
    return result


def _refuse(path: Path, problems: Sequence[str]) -> None:
    print(f"rackguard: invalid configuration {path}:", file=sys.stderr)
    for problem in problems:
        print(f"  {problem}", file=sys.stderr)


def _load(path: Path) -> Config | None:
    try:
        return load_config(path)
    except ConfigError as err:
        _refuse(path, err.problems)
        return None


def _load_for_this_node(args: argparse.Namespace, path: Path) -> Config | None:
    """The file's config, with the checks that need this machine (what `run` would refuse)."""
    config = _load(path)
    if config is None:
        return None
    problems = preflight_problems(config, nvml_injected=args.nvml is not None)
    if problems:
        _refuse(path, problems)
        return None
    return config


def cmd_check_config(args: argparse.Namespace) -> int:
    """Validate a config file; exit 2 naming each bad key."""
    config = _load_for_this_node(args, args.file)
    if config is None:
        return EXIT_CONFIG
    problems, notes = asyncio.run(_source_problems(config, args.nvml))
    for note in [*config_notes(config), *notes]:
        print(f"rackguard: {note}", file=sys.stderr)
    if problems:
        _refuse(args.file, problems)
        return EXIT_CONFIG
    print(f"{args.file}: OK (node {config.node.name}, {len(config.sources)} source(s))")
    return 0


async def _source_problems(config: Config, nvml: Any) -> tuple[list[str], list[str]]:
    """Problems found on the sources' devices, and notes on what was or was not checked."""
    from daemon.snmp_probe import snmp_source_problems  # noqa: PLC0415

    local = await _local_source_problems(config, nvml)
    snmp, notes = await snmp_source_problems(config)
    return local + snmp, notes


async def _local_source_problems(config: Config, nvml: Any) -> list[str]:
    """What `run` would stop at in this node's own GPUs as the config names them (an index
    the node lacks), as problems naming the source. NVML is local and answers at once;
    a machine without the driver (a config checked off the node) is not the file's fault,
    and an unreachable PDU or CDU is only retried by `run`."""
    from daemon.config.sources import NvmlSourceConfig  # noqa: PLC0415
    from daemon.service.build import first_connect  # noqa: PLC0415
    from daemon.service.sources import build_adapter  # noqa: PLC0415

    problems = []
    for name, cfg in config.sources.items():
        if not isinstance(cfg, NvmlSourceConfig):
            continue
        try:
            await first_connect(build_adapter(name, cfg, nvml=nvml), cfg)
        except SourceMismatch as err:
            problems.append(f"sources.{name}.gpus: {err}")
        except (SourceError, TimeoutError):
            pass  # the machine's state, not the file's: `run` says so, or retries
    return problems


def cmd_run(args: argparse.Namespace) -> int:
    """Run the daemon until SIGTERM/SIGINT."""
    config = _load_for_this_node(args, args.config)
    if config is None:
        return EXIT_CONFIG
    setup_logging(config.logging.level, config.logging.format)
    return run_async(_run(config, args.config, args.nvml))


async def _run(config: Config, path: Path, nvml: Any) -> int:
    from daemon.app import Daemon, StartupError  # noqa: PLC0415 - keeps check-config light

    try:
        daemon = Daemon(config, config_path=path, nvml=nvml)
        await daemon.check_sources()
        await daemon.run()
    except (StartupError, SourceError) as err:
        print(f"rackguard: cannot start: {err}", file=sys.stderr)
        return EXIT_STARTUP
    return 0


def cmd_probe(args: argparse.Namespace) -> int:
    """One read of one configured source, as a table or JSON."""
    config = _load(args.config)
    if config is None:
        return EXIT_CONFIG
    if args.source not in config.sources:
        known = ", ".join(sorted(config.sources))
        print(
            f"rackguard: no source {args.source!r} in {args.config} (have: {known})",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    if args.all_profiles:
        from daemon.config.snmp import SnmpSourceConfig  # noqa: PLC0415
        from daemon.snmp_probe import survey  # noqa: PLC0415

        if not isinstance(config.sources[args.source], SnmpSourceConfig):
            print(f"rackguard: --all-profiles is for SNMP sources; {args.source!r} is not one",
                  file=sys.stderr)  # fmt: skip
            return EXIT_CONFIG
        return run_async(survey(config, args.source, as_json=args.json))
    return run_async(_probe(config, args.source, as_json=args.json, nvml=args.nvml))


async def _probe(config: Config, name: str, *, as_json: bool, nvml: Any) -> int:
    from daemon.http.api import series_of  # noqa: PLC0415
    from daemon.http.bodies import to_wire  # noqa: PLC0415
    from daemon.service.sources import build_adapter  # noqa: PLC0415

    cfg = config.sources[name]
    try:
        adapter = build_adapter(name, cfg, nvml=nvml)
        try:
            async with time_limit(max(cfg.timeout_s, 5.0)):
                await adapter.connect()
                readings = await adapter.read()
        finally:
            await adapter.close()
    except (SourceError, TimeoutError) as err:
        print(f"rackguard: probe of {name!r} failed: {err or 'timed out'}", file=sys.stderr)
        return EXIT_STARTUP
    for note in getattr(adapter, "notes", ()):  # which profile, what the device lacks
        print(f"rackguard: {name}: {note.removeprefix(f'{name}: ')}", file=sys.stderr)
    now = readings[0].mono if readings else 0.0
    rows = [to_wire(series_of(r, now)) for r in readings]
    if as_json:
        sys.stdout.write(orjson.dumps(rows, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print(format_table(rows))
    # A device its profile reads nothing useful from is a configuration to fix.
    degraded = getattr(adapter, "degraded_reason", "")
    missing = getattr(adapter, "missing", ())
    if degraded:
        print(f"rackguard: {name}: {degraded}", file=sys.stderr)
        print(f"rackguard: {name}: try `rackguard probe {name} --all-profiles`", file=sys.stderr)
        return EXIT_CONFIG
    if missing:
        print(f"rackguard: {name}: not read from this device: {', '.join(missing)}",
              file=sys.stderr)  # fmt: skip
    return 0


_ROW_LABELS = frozenset({"active", "oid", "probe", "phase", "outlet", "inlet", "description"})


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """Readings as an aligned text table; each device's identity printed once above its rows."""
    header = ("SENSOR", "VALUE", "UNIT", "QUALITY", "DETAIL")
    lines: list[tuple[str, ...]] = [header]
    last_identity = ""
    for row in rows:
        labels = row["labels"]
        # The device's identity, printed once above its rows; per-row labels stay out.
        identity = " ".join(f"{k}={v}" for k, v in labels.items() if k not in _ROW_LABELS)
        if identity and identity != last_identity:
            lines.append((f"# {identity}",))
            last_identity = identity
        value = "" if row["value"] is None else f"{row['value']:g}"
        detail = row["reason"] or labels.get("active", "")
        lines.append((row["sensor"], value, row["unit"], row["quality"], detail))
    table = [line for line in lines if len(line) == len(header)]
    widths = [max(len(line[i]) for line in table) for i in range(len(header) - 1)]
    return "\n".join(
        line[0]
        if len(line) == 1
        else (
            "  ".join(c.ljust(w) for c, w in zip(line[:-1], widths, strict=True)) + "  " + line[-1]
        ).rstrip()
        for line in lines
    )


def cmd_files(args: argparse.Namespace) -> int:
    """Print a packaged deployment file, or list them with their installed paths."""
    from daemon.deploy import FILES, deploy_file  # noqa: PLC0415

    if args.name is None:
        for name, (_, what) in FILES.items():
            print(f"{name:<11} {deploy_file(name)}  ({what})")
        return 0
    if args.name not in FILES:
        print(f"rackguard: no file {args.name!r} (have: {', '.join(FILES)})", file=sys.stderr)
        return EXIT_CONFIG
    sys.stdout.write(deploy_file(args.name).read_text())
    return 0


def cmd_powercap_helper(args: argparse.Namespace) -> int:
    """Serve GPU power-limit requests from the daemon's user (runs as root)."""
    from adapters.sensors.nvml import load_binding  # noqa: PLC0415 - helper only
    from daemon.powercap_helper import run_helper  # noqa: PLC0415 - helper only

    setup_logging()
    try:
        binding = args.nvml if args.nvml is not None else load_binding()
    except SourceError as err:
        print(f"rackguard powercap-helper: {err}", file=sys.stderr)
        return EXIT_STARTUP
    idle = args.idle_exit_s if args.idle_exit_s > 0 else None
    return run_async(
        run_helper(binding, allowed_user=args.allow_user, idle_exit_s=idle, socket_path=args.socket)
    )


def version_line() -> str:
    """`rackguard X.Y.Z (Python A.B.C)`: what is running."""
    return f"rackguard {package_version()} (Python {platform.python_version()})"


def _seconds(text: str) -> float:
    """A finite, non-negative number of seconds (argparse type)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"not a number of seconds >= 0: {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand."""
    p = argparse.ArgumentParser(
        prog="rackguard",
        description="Drain GPU nodes before thermal and power events hurt them.",
    )
    p.add_argument("--version", action="version", version=version_line())
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the daemon")
    run.add_argument("--config", "-c", type=Path, required=True)
    run.set_defaults(func=cmd_run)

    check = sub.add_parser("check-config", help="validate a config file (exit 2 if invalid)")
    check.add_argument("file", type=Path)
    check.set_defaults(func=cmd_check_config)

    probe = sub.add_parser("probe", help="read one configured source once and print it")
    probe.add_argument("source")
    probe.add_argument("--config", "-c", type=Path, required=True)
    probe.add_argument("--json", action="store_true", help="print JSON instead of a table")
    probe.add_argument(
        "--all-profiles",
        action="store_true",
        help="(SNMP) try every profile on the device and report what each reads",
    )
    probe.set_defaults(func=cmd_probe)

    replay_cmd.add_parser(sub)

    helper = sub.add_parser(
        "powercap-helper",
        help="the privileged power-limit helper (started by rackguard-powercap.socket)",
    )
    helper.add_argument(
        "--allow-user", default="rackguard", help="the only user served (default: rackguard)"
    )
    helper.add_argument(
        "--idle-exit-s",
        type=_seconds,
        default=30.0,
        help="exit after this long with no connection; 0 = never (default: 30)",
    )
    helper.add_argument(
        "--socket", help="listen here instead of on the socket systemd passes (tests)"
    )
    helper.set_defaults(func=cmd_powercap_helper)

    files = sub.add_parser(
        "files", help="print a file shipped for installing (unit, config, alerts, ...)"
    )
    files.add_argument("name", nargs="?", help="which file; without it, list them")
    files.set_defaults(func=cmd_files)

    return p


def main(argv: Sequence[str] | None = None, *, nvml: Any = None) -> int:
    """Entry point of the console script.

    ``nvml`` is a simulated NVML binding injected by fakes/nvml_module.py (the
    tests, a shell on a machine without GPUs); the console script never passes one.
    """
    args = build_parser().parse_args(argv)
    args.nvml = nvml
    try:
        code: int = args.func(args)
        sys.stdout.flush()
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `rackguard probe ... | head -1`: the reader left; that is not an error of ours.
        stdout_gone()
        return 0
    except OSError as e:
        # In one line, not a traceback: what escapes a command is most often writing its
        # output (`> file` on a full disk); the commands name their own files' errors.
        stdout_gone()
        print(f"rackguard: {e}", file=sys.stderr)
        return 1
    return code


def stdout_gone() -> None:
    """Point stdout at /dev/null, so that the interpreter's final flush does not fail too."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
