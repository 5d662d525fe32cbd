"""`make bench`: every benchmark, printed as one table."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from bench import (
    agent_cost,
    api_rps,
    controller_load,
    delivery_latency,
    fleet_cost,
    notice_latency,
    notice_rest,
    opcua_cost,
    replay_shards,
    replay_speed,
    scoring,
    snmp_cost,
    storage_lag,
)
from bench.report import Row, render


def main() -> None:
    """Run the benchmarks (all, or those named with --only) and print the table."""
    p = argparse.ArgumentParser(prog="python -m bench")
    p.add_argument("--seconds", type=float, default=60.0, help="length of the agent CPU run")
    p.add_argument(
        "--only",
        default="",
        help="comma-separated subset of: "
        + ", ".join(
            (
                "agent",
                "delivery",
                "notice",
                "notice-rest",
                "storage",
                "opcua",
                "snmp",
                "api",
                "scoring",
                "replay",
                "fleet",
                "controller",
            )
        ),
    )
    args = p.parse_args()
    benches: dict[str, Callable[[], list[Row]]] = {
        "agent": lambda: agent_cost.measure(args.seconds),
        "delivery": delivery_latency.measure,
        "notice": notice_latency.measure,
        "notice-rest": notice_rest.measure,
        "storage": storage_lag.measure,
        "opcua": lambda: opcua_cost.measure(seconds=3.0, repeats=5),
        "snmp": snmp_cost.measure,
        "api": api_rps.measure,
        "scoring": scoring.measure,
        "replay": lambda: replay_speed.measure() + replay_shards.measure(),
        "fleet": fleet_cost.measure,
        "controller": controller_load.measure,
    }
    wanted = [w for w in args.only.split(",") if w] or list(benches)
    unknown = set(wanted) - set(benches)
    if unknown:
        p.error(f"unknown benchmark(s): {', '.join(sorted(unknown))}")
    rows: list[Row] = []
    for name in wanted:
        rows += benches[name]()
    print(render(rows))


if __name__ == "__main__":
    main()
