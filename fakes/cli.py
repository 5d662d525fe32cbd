"""The `rackguard-sim` command (development install only): the demo on simulated hardware."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from daemon.cli import run_async


def cmd_demo(args: argparse.Namespace) -> int:
    """The whole stack on fakes, with a live view."""
    from fakes.demo import run_demo  # noqa: PLC0415 - the simulator loads only when asked for

    return run_async(
        run_demo(scenario=args.scenario, speed=args.speed, live=not args.no_live, seed=args.seed)
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand."""
    p = argparse.ArgumentParser(
        prog="rackguard-sim",
        description="rackguard on simulated hardware: the demo (development install only).",
    )
    sub = p.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the whole stack on simulated hardware")
    demo.add_argument("--scenario", default="hot-gpu")
    demo.add_argument(
        "--speed",
        type=float,
        default=None,
        help="simulated seconds per wall second (default: the scenario plays in ~1 min)",
    )
    demo.add_argument("--seed", type=int, default=None)
    demo.add_argument("--no-live", action="store_true", help="print events, not a live view")
    demo.set_defaults(func=cmd_demo)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
