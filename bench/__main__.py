"""`make bench`: every benchmark, printed as one table."""

from __future__ import annotations

import argparse

from bench import agent_cost, delivery_latency, opcua_cost, scoring, snmp_cost
from bench.report import Row, render


def main() -> None:
    """Run the benchmarks and print the table."""
    p = argparse.ArgumentParser(prog="python -m bench")
    p.add_argument("--seconds", type=float, default=60.0, help="length of the agent CPU run")
    args = p.parse_args()
    rows: list[Row] = []
    rows += agent_cost.measure(args.seconds)
    rows += delivery_latency.measure()
    rows += opcua_cost.measure(seconds=3.0, repeats=5)
    rows += snmp_cost.measure()
    rows += scoring.measure()
    print(render(rows))


if __name__ == "__main__":
    main()
