"""`rackguard replay TRACE --config FILE`: the policy over a trace, decisions as JSON lines.

Only the config's ``[policy]`` table is read (a replay needs no sources, secrets
or scheduler), so a production config replays on any machine. A ``.gz`` trace is
read compressed. Exit 0 after the last decision, 2 for an invalid config or
``--interval``, 1 for a trace that cannot be read or decisions that cannot be
written (a full disk); 0, quietly, when the reader of stdout leaves (``| head``).
"""

from __future__ import annotations

import argparse
import gc
import gzip
import sys
import tomllib
import zlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from daemon.config import read_config_text
from daemon.config.policy import PolicyConfig, policy_settings
from daemon.config.typed_toml import ConfigError, load_typed
from policies.replay import decision_lines, replay
from policies.trace import TraceError

EXIT_TRACE = 1
EXIT_CONFIG = 2


def load_policy(path: Path) -> PolicyConfig:
    """The ``[policy]`` table of a config file; ConfigError names each bad key."""
    text = read_config_text(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError([f"{path}: not valid TOML: {err}"]) from err
    table = data.get("policy", {})
    if not isinstance(table, dict):
        raise ConfigError(["policy: must be a table"])
    try:
        return load_typed(PolicyConfig, table)
    except ConfigError as err:
        raise ConfigError([f"policy.{p}" for p in err.problems]) from err


@contextmanager
def _open_trace(path: Path) -> Iterator[Iterable[bytes]]:
    # Binary: the trace reader takes UTF-8 lines as bytes, read faster than through a
    # text decoder, and names a line that is not UTF-8 (policies/trace.py).
    if path.suffix == ".gz":
        with gzip.open(path, "rb") as f:
            yield f
    else:
        with path.open("rb") as f:
            yield f


@contextmanager
def _fewer_collections() -> Iterator[None]:
    # A replay allocates millions of short-lived readings and few cycles; at the
    # default thresholds the cyclic collector took a quarter of its time, mostly
    # promoting readings about to die. Collect less often (not never) meanwhile.
    old = gc.get_threshold()
    gc.set_threshold(100_000, 50, 1000)
    try:
        yield
    finally:
        gc.set_threshold(*old)


def run_replay(
    trace: Path, config: Path | None, *, out: TextIO, err: TextIO, interval_s: float | None = None
) -> int:
    """Replay ``trace`` under ``config``'s policy, writing decision lines to ``out``."""
    try:
        cfg = load_policy(config) if config is not None else PolicyConfig()
    except ConfigError as e:
        print(f"rackguard: invalid configuration {config}:", file=err)
        for problem in e.problems:
            print(f"  {problem}", file=err)
        return EXIT_CONFIG
    if interval_s is not None:
        # The bounds of evaluate_interval_s: a zero or negative step never moves the
        # grid, and a tiny one takes forever.
        try:
            load_typed(PolicyConfig, {"evaluate_interval_s": interval_s})
        except ConfigError as e:
            for problem in e.problems:
                print(f"rackguard: invalid --interval: {problem.partition(': ')[2]}", file=err)
            return EXIT_CONFIG
    settings = policy_settings(cfg)
    step = interval_s if interval_s is not None else cfg.evaluate_interval_s
    try:
        with _open_trace(trace) as lines, _fewer_collections():
            for line in decision_lines(replay(lines, settings, interval_s=step)):
                with _writing():
                    out.write(line + "\n")
        with _writing():
            out.flush()  # here, so that a full disk is told, not lost at exit
    except _OutputFailed as e:
        if isinstance(e.error, BrokenPipeError):
            raise e.error from None  # the reader left (`| head`): the CLI ends quietly
        print(f"rackguard: cannot write decisions: {e.error}", file=err)
        return EXIT_TRACE
    except (OSError, EOFError, zlib.error) as e:  # zlib.error: a .gz whose data is damaged
        print(f"rackguard: cannot read trace {trace}: {e}", file=err)
        return EXIT_TRACE
    except TraceError as e:
        print(f"rackguard: invalid trace {trace}: {e}", file=err)
        return EXIT_TRACE
    return 0


class _OutputFailed(Exception):
    """Writing the decisions failed (not reading the trace): carries the OSError."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


@contextmanager
def _writing() -> Iterator[None]:
    """Around a write of the decisions: its OSError becomes _OutputFailed."""
    try:
        yield
    except OSError as e:
        raise _OutputFailed(e) from e


def cmd_replay(args: argparse.Namespace) -> int:
    """The CLI entry: args.trace, args.config (optional), args.interval (optional)."""
    return run_replay(
        args.trace,
        args.config,
        out=sys.stdout,
        err=sys.stderr,
        interval_s=getattr(args, "interval", None),
    )


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register the ``replay`` subcommand on the CLI's subparsers."""
    p = sub.add_parser(
        "replay", help="run the policy over a recorded trace; print decisions as JSON lines"
    )
    p.add_argument("trace", type=Path, help="a trace file (JSON lines, optionally .gz)")
    p.add_argument("--config", "-c", type=Path, default=None, help="take [policy] from this file")
    p.add_argument(
        "--interval",
        type=float,
        default=None,
        help="seconds between evaluations (default: the config's evaluate_interval_s)",
    )
    p.set_defaults(func=cmd_replay)
