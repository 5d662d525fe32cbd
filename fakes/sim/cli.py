"""`rackguard-sim` (simulation install only): serve, node, fault, status, score, trace, check.

Exit status: 0 done (for ``score``: the run passed), 1 the score failed or the
harness could not be reached, 2 bad input (a scenario, an argument or a fault
request), naming the file and the key.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import orjson

from daemon.cli import run_async, stdout_gone
from fakes.sim.decision_logs import LogError, Row, read_log
from fakes.sim.faults import FAULTS, coerce
from fakes.sim.scenario import Scenario, ScenarioError, load_scenario
from fakes.sim.scoring import (
    DecisionScore,
    first_actions,
    first_crossing,
    never_applied,
    onset,
    throttled_in_service,
)
from fakes.sim.snmp_engine_agent import AUTH, PRIV, V3User
from fakes.sim.trace_writer import WALL_EPOCH, scenario_readings, write_trace

if TYPE_CHECKING:
    from fakes.sim.harness import ServeOptions

DEFAULT_CONTROL = "127.0.0.1:8790"
log = logging.getLogger("rackguard-sim")


class UsageError(ValueError):
    """A bad argument; the message names it."""


def _address(text: str, what: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise UsageError(f"--{what}: expected HOST:PORT, got {text!r}")
    return host, int(port)


def _secret(path: str | None, what: str, min_len: int = 8) -> str:
    if path is None:
        raise UsageError(f"--{what} is required with --v3-user")
    try:
        text = Path(path).read_text(encoding="utf-8").strip()
    except OSError as err:
        raise UsageError(f"--{what}: {path!r} cannot be read: {err.strerror or err}") from err
    if not text:
        raise UsageError(f"--{what}: {path!r} is empty")
    if len(text) < min_len:
        raise UsageError(f"--{what}: {path!r}: SNMPv3 keys need at least {min_len} characters")
    return text


# --- serve -----------------------------------------------------------------------------


def _sources_toml(endpoints: dict[str, Any], community_file: Path | None) -> str:
    pdu, cdu = endpoints["pdu"], endpoints["cdu"]
    probes = ", ".join(f'"{k}" = "{v}"' for k, v in pdu["probe_positions"].items())
    community = f'community_file = "{community_file}"\n' if community_file else ""
    return (
        "# The simulated rack's devices, for a daemon config's [sources] (written by serve).\n"
        "[sources.pdu]\n"
        'type = "snmp"\n'
        f'host = "{pdu["host"]}"\n'
        f"port = {pdu['port']}\n"
        f'profile = "{pdu["profile"]}"\n'
        f"{community}"
        f"probe_positions = {{ {probes} }}\n"
        "[sources.cdu]\n"
        'type = "opcua"\n'
        f'url = "{cdu["url"]}"\n'
        f'profile = "{cdu["profile"]}"\n'
    )


def serve_options(args: argparse.Namespace) -> ServeOptions:
    """The serve arguments checked, secrets read from their files."""
    from fakes.sim.harness import ServeOptions  # noqa: PLC0415 - asyncua only for serve

    pdu_host, pdu_port = _address(args.pdu, "pdu")
    cdu_host, cdu_port = _address(args.cdu, "cdu")
    community = "public"
    if args.community_file:
        community = _secret(args.community_file, "community-file", min_len=1)
    users: tuple[V3User, ...] = ()
    if args.v3_user:
        users = (
            V3User(
                args.v3_user,
                _secret(args.v3_auth_key_file, "v3-auth-key-file"),
                _secret(args.v3_priv_key_file, "v3-priv-key-file")
                if args.v3_priv_protocol != "none"
                else "",
                args.v3_auth_protocol,
                args.v3_priv_protocol,
            ),
        )
    scheduler_host: str | None = None
    scheduler_port = 0
    secret = b""
    if args.scheduler:
        scheduler_host, scheduler_port = _address(args.scheduler, "scheduler")
        if not args.webhook_key_file:
            raise UsageError("--webhook-key-file is required with --scheduler")
        # Stripped, as the daemon strips its secret_file before signing.
        secret = _secret(args.webhook_key_file, "webhook-key-file", min_len=1).encode()
    elif args.webhook_key_file:
        raise UsageError("--webhook-key-file: only with --scheduler")
    return ServeOptions(
        state_dir=Path(args.state_dir),
        scheduler_host=scheduler_host,
        scheduler_port=scheduler_port,
        webhook_secret=secret,
        speed=args.speed,
        seed=args.seed,
        pdu_host=pdu_host,
        pdu_port=pdu_port,
        pdu_profile=args.pdu_profile,
        community=community,
        v3_users=users,
        cdu_host=cdu_host,
        cdu_port=cdu_port,
        cdu_model=args.cdu_model,
        nodeset_dir=Path(args.nodeset_dir) if args.nodeset_dir else None,
    )


async def _serve(
    args: argparse.Namespace, scenario: Scenario, options: ServeOptions, community_file: Path | None
) -> int:
    from fakes.sim.control import start_control  # noqa: PLC0415 - aiohttp only for serve
    from fakes.sim.harness import Harness  # noqa: PLC0415

    control_host, control_port = _address(args.control, "control")
    try:
        harness = Harness(scenario, options)
    except ValueError as err:
        raise UsageError(str(err)) from err
    try:
        await harness.start()
    except OSError as err:
        await harness.stop()
        raise UsageError(f"cannot listen: {err}") from err
    try:
        control = await start_control(harness, control_host, control_port)
    except (OSError, ValueError) as err:
        await harness.stop()
        raise UsageError(str(err)) from err
    sources = options.state_dir / "sources.toml"
    sources.write_text(
        _sources_toml(
            harness.endpoints(),
            community_file,
        )
    )
    staging = (
        f"scheduler {harness.scheduler.url} (webhook), "
        if harness.scheduler is not None
        else "no scheduler (score judges the daemon's log only), "
    )
    print(
        f"rackguard-sim: serving scenario {scenario.name} (x{args.speed:g}): "
        f"PDU snmp {options.pdu_host}:{harness.pdu.port} ({options.pdu_profile}), "
        f"CDU {harness.cdu.url} ({harness.cdu.model}), {staging}control http://{args.control}; "
        f"GPUs and run record in {options.state_dir}; sources for a config in {sources}",
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    runner = asyncio.create_task(harness.run())
    waiter = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({runner, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (runner, waiter):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await control.cleanup()
        await harness.stop()
    if runner.done() and not runner.cancelled() and runner.exception() is not None:
        raise runner.exception()  # type: ignore[misc]
    print(f"rackguard-sim: stopped at t={harness.t:.0f}s", flush=True)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the simulated rack until SIGINT/SIGTERM."""
    scenario = load_scenario(args.scenario)
    community_file = Path(args.community_file).absolute() if args.community_file else None
    return asyncio.run(_serve(args, scenario, serve_options(args), community_file))


# --- control-API clients ---------------------------------------------------------------


def _request(control: str, path: str, body: bytes | None = None) -> tuple[int, Any]:
    host, port = _address(control, "control")
    req = urllib.request.Request(
        f"http://{host}:{port}{path}",
        data=body,
        method="POST" if body is not None else "GET",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as rsp:
            return rsp.status, orjson.loads(rsp.read())
    except urllib.error.HTTPError as err:
        return err.code, orjson.loads(err.read() or b"{}")
    except (urllib.error.URLError, OSError) as err:
        raise ConnectionError(f"no harness at http://{host}:{port}: {err}") from err


def cmd_fault(args: argparse.Namespace, out: TextIO) -> int:
    """Apply one fault (or list them) through the control API."""
    if args.name == "list":
        for f in FAULTS.values():
            takes = " ".join(f"{k}=<{'required' if v is None else v}>" for k, v in f.params.items())
            print(f"{f.name:15} {f.description}{'  ' + takes if takes else ''}", file=out)
        return 0
    params: dict[str, Any] = {}
    for item in args.params:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"{args.name}: {item!r}: parameters are KEY=VALUE")
        params[key] = coerce(value)
    status, body = _request(args.control, f"/v1/faults/{args.name}", orjson.dumps(params))
    if status != 200:
        raise UsageError(body.get("error", f"HTTP {status}"))
    print(f"t={body['t']:.0f}s {body['fault']} {orjson.dumps(body['params']).decode()}", file=out)
    return 0


def cmd_status(args: argparse.Namespace, out: TextIO) -> int:
    """Print what the harness did so far (JSON)."""
    deadline = time.monotonic() + args.wait
    while True:
        try:
            _, body = _request(args.control, "/v1/status")
            break
        except ConnectionError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.2)
    out.write(orjson.dumps(body, option=orjson.OPT_INDENT_2).decode() + "\n")
    return 0


# --- node ------------------------------------------------------------------------------


def cmd_node(args: argparse.Namespace) -> int:
    """A `rackguard` command (run, probe, check-config) on a simulated node's GPUs."""
    from daemon import cli as daemon_cli  # noqa: PLC0415 - only this verb runs the daemon
    from fakes.sim.served_gpus import ServedNvml  # noqa: PLC0415

    rest = list(args.rackguard_args)
    if rest[:1] == ["--"]:
        rest = rest[1:]
    if not rest:
        raise UsageError("node: give the rackguard command to run, e.g. -- run --config FILE")
    # The daemon takes the simulated NVML injected here and says so loudly
    # (a WARNING at start, "simulated": true in /v1/state and /readyz).
    return daemon_cli.main(rest, nvml=ServedNvml(Path(args.gpus)))


# --- score -----------------------------------------------------------------------------


def score(scenario: Scenario, rows: list[Row], run: dict[str, Any] | None) -> DecisionScore:
    """Decisions against the scenario's truth, on the serve run's clock or the trace's."""
    if run is not None:
        wall_start, speed = float(run["wall_start"]), float(run["speed"])
        crossing = run.get("first_crossing")
        crossing_s = float(crossing["t"]) if crossing else None
        # The thermal onset: a fault of the rack itself, not of how a device answers.
        fault_times = [
            float(f["t"])
            for f in run.get("faults", [])
            if f.get("target") == "simulator" and not str(f.get("fault")).endswith("_restore")
        ]
        starts = [t for t in (onset(scenario), *fault_times) if t is not None]
        onset_s = min(starts) if starts else None
    else:  # the trace writer's clock: wall = WALL_EPOCH + t
        wall_start, speed = WALL_EPOCH, 1.0
        _, trace = scenario_readings(scenario, rack_sources=False)
        crossing_s = first_crossing(scenario, trace)
        onset_s = onset(scenario)
    result = _judge(scenario, rows, run, wall_start, speed, onset_s, crossing_s)
    result.invalid = str(run.get("invalid") or "") if run is not None else ""
    return result


def _judge(
    scenario: Scenario,
    rows: list[Row],
    run: dict[str, Any] | None,
    wall_start: float,
    speed: float,
    onset_s: float | None,
    crossing_s: float | None,
) -> DecisionScore:
    decided = [((at - wall_start) * speed, node, action) for at, node, action in rows]
    scheduler = run.get("scheduler") if run is not None else None
    if run is None or not isinstance(scheduler, dict):
        judged = "the decision log" if run is None else "the daemon's decision log only"
        if run is not None:  # serve ran without --scheduler: nothing saw what was applied
            judged += " (serve ran no scheduler: what was applied is not known)"
        first = first_actions(decided)
        result = DecisionScore(
            scenario.name, onset_s, crossing_s, first, scenario.expect.drained_nodes, judged
        )
        if run is None:
            _, trace = scenario_readings(scenario, rack_sources=False)
            result.throttled_gpu_s = throttled_in_service(scenario, trace, first)
        return result
    applied = [(float(a["t"]), str(a["node"]), str(a["action"])) for a in run.get("applied", [])]
    return DecisionScore(
        scenario.name,
        onset_s,
        crossing_s,
        first_actions(applied),
        scenario.expect.drained_nodes,
        f"what the scheduler at {scheduler.get('url')} applied",
        tuple(never_applied(decided, applied)),
        run.get("throttled_gpu_seconds_in_service"),
    )


def _read_run(path: str) -> dict[str, Any]:
    try:
        run = orjson.loads(Path(path).read_bytes())
    except (OSError, orjson.JSONDecodeError) as err:
        raise UsageError(f"--run: {path!r}: {err}") from err
    if not isinstance(run, dict) or run.get("format") != "rackguard-sim-run":
        raise UsageError(f"--run: {path!r}: not a run record of rackguard-sim serve")
    return run


def _final(result: DecisionScore, scenario: Scenario, run: dict[str, Any] | None) -> bool:
    """Passed, and nothing left to wait for: the crossing seen, or none due, or the run over."""
    if not result.passed:
        return False
    if run is None or result.crossing_s is not None:
        return True
    return scenario.expect.first_crossing is None or float(run["t"]) >= scenario.duration_s


def cmd_score(args: argparse.Namespace, out: TextIO) -> int:
    """Score decision logs; with --wait, re-read them until the run passes or time is up."""
    scenario = load_scenario(args.scenario)
    deadline = time.monotonic() + args.wait
    while True:
        run = _read_run(args.run) if args.run else None
        try:
            rows = [row for source in args.logs for row in read_log(source)]
        except LogError as err:
            if time.monotonic() < deadline:
                time.sleep(0.5)
                continue
            raise UsageError(str(err)) from err
        result = score(scenario, rows, run)
        if _final(result, scenario, run) or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    print("\n".join(result.lines()), file=out)
    return 0 if result.passed else 1


# --- trace, check ----------------------------------------------------------------------


def cmd_trace(args: argparse.Namespace, out: TextIO) -> int:
    """Write a scenario's trace to stdout."""
    scenario = load_scenario(args.scenario)
    write_trace(scenario, out, seed=args.seed, interval_s=args.interval)
    return 0


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def cmd_check(args: argparse.Namespace, out: TextIO) -> int:
    """Validate a scenario file and say what it holds."""
    sc = load_scenario(args.scenario)
    expect = ", ".join(sc.expect.drained_nodes) or "none"
    print(
        f"{args.scenario}: ok: scenario {sc.name}, {sc.duration_s:g} s, "
        f"{_count(len(sc.rack.nodes), 'node')} x {sc.rack.gpus_per_node} {sc.rack.gpu_model}, "
        f"{_count(len(sc.events), 'event')}; expected drained: {expect}",
        file=out,
    )
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """The whole stack on fakes, with a live view (four real agents, one simulated rack)."""
    from fakes.demo import run_demo  # noqa: PLC0415 - the demo's imports load only when asked for

    return run_async(
        run_demo(
            scenario=args.scenario,
            speed=args.speed,
            live=not args.no_live,
            seed=args.seed,
            caps=not args.no_caps,
        )
    )


def build_parser() -> argparse.ArgumentParser:
    """Every subcommand's arguments."""
    p = argparse.ArgumentParser(
        prog="rackguard-sim", description="A simulated rack for staging rackguard."
    )
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="run a simulated rack on real protocols")
    s.add_argument("scenario", help="a scenario file (or a shipped scenario's name)")
    s.add_argument("--state-dir", required=True, help="where GPUs and the run record go")
    s.add_argument("--speed", type=float, default=1.0, help="simulated seconds per second")
    s.add_argument("--seed", type=int, default=None)
    s.add_argument("--pdu", default="127.0.0.1:1161", help="SNMP agent HOST:PORT (UDP)")
    s.add_argument(
        "--pdu-profile",
        default="apc-rpdu2",
        choices=("apc-rpdu2", "raritan-px2", "sentry4"),
        help="which vendor MIB the PDU speaks",
    )
    s.add_argument("--community-file", help="SNMPv2c community (default: public)")
    s.add_argument("--v3-user", help="an SNMPv3 user the agent accepts")
    s.add_argument("--v3-auth-protocol", default="sha", choices=sorted(AUTH))
    s.add_argument("--v3-auth-key-file")
    s.add_argument("--v3-priv-protocol", default="aes", choices=sorted(PRIV))
    s.add_argument("--v3-priv-key-file")
    s.add_argument("--cdu", default="127.0.0.1:4840", help="OPC-UA server HOST:PORT")
    s.add_argument("--cdu-model", default="generic", choices=("generic", "tcd"))
    s.add_argument("--nodeset-dir", help="the OPC 40082-1 nodesets (for --cdu-model tcd)")
    s.add_argument("--control", default=DEFAULT_CONTROL, help="control API HOST:PORT (loopback)")
    s.add_argument(
        "--scheduler",
        help="run the staging scheduler (a webhook receiver) at HOST:PORT; score judges what it"
        " applied",
    )
    s.add_argument("--webhook-key-file", help="the webhook key the daemon signs with")

    n = sub.add_parser(
        "node", help="run a rackguard command on a simulated node's GPUs (the file serve writes)"
    )
    n.add_argument("--gpus", required=True, help="STATE_DIR/gpus/NODE.json")
    n.add_argument("rackguard_args", nargs=argparse.REMAINDER, help="-- run --config FILE")

    f = sub.add_parser("fault", help="apply a fault to a running harness ('list' lists them)")
    f.add_argument("name")
    f.add_argument("params", nargs="*", help="KEY=VALUE parameters")
    f.add_argument("--control", default=DEFAULT_CONTROL)

    st = sub.add_parser("status", help="what the running harness did so far (JSON)")
    st.add_argument("--control", default=DEFAULT_CONTROL)
    st.add_argument("--wait", type=float, default=0.0, help="wait this long for the harness")

    sc = sub.add_parser("score", help="score decision logs against the scenario's truth")
    sc.add_argument("scenario")
    sc.add_argument("logs", nargs="+", help="/v1/decisions URLs, outbox files or replay output")
    sc.add_argument("--run", help="the serve run record (STATE_DIR/run.json)")
    sc.add_argument(
        "--wait",
        type=float,
        default=0.0,
        help="re-read for up to this long, until it passed and its crossing (if due) was seen",
    )

    t = sub.add_parser("trace", help="write a scenario's trace (JSON lines) to stdout")
    t.add_argument("scenario")
    t.add_argument("--seed", type=int, default=None)
    t.add_argument("--interval", type=float, default=1.0, help="GPU reading interval, s")

    c = sub.add_parser("check", help="validate a scenario file")
    c.add_argument("scenario")

    d = sub.add_parser("demo", help="the whole stack on simulated hardware (what `make demo` runs)")
    d.add_argument("--scenario", default="hot-gpu", help="a shipped scenario's name or a file")
    d.add_argument(
        "--speed",
        type=float,
        default=None,
        help="simulated seconds per wall second (default: the scenario plays in ~1 min)",
    )
    d.add_argument("--seed", type=int, default=None)
    d.add_argument("--no-live", action="store_true", help="print events, not a live view")
    d.add_argument("--no-caps", action="store_true", help="drain-only: the agents do not cap power")
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `rackguard-sim` console script."""
    args = build_parser().parse_args(argv)
    if args.command == "serve":  # `node` leaves logging to the daemon's own setup
        logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
        logging.getLogger("asyncua").setLevel(logging.ERROR)  # its address-space chatter
    out = sys.stdout
    try:
        if args.command == "serve":
            return cmd_serve(args)
        if args.command == "node":
            return cmd_node(args)
        if args.command == "demo":
            return cmd_demo(args)
        handlers = {
            "fault": cmd_fault,
            "status": cmd_status,
            "score": cmd_score,
            "trace": cmd_trace,
            "check": cmd_check,
        }
        return handlers[args.command](args, out)
    except (ScenarioError, UsageError) as err:
        print(f"rackguard-sim: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # before ConnectionError, its base: `| head` is not an error
        stdout_gone()
        return 1
    except ConnectionError as err:
        print(f"rackguard-sim: {err}", file=sys.stderr)
        return 1
    except OSError as err:  # most often writing the output (`> file` on a full disk)
        stdout_gone()
        print(f"rackguard-sim: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
