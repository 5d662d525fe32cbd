"""SNMP checks of `rackguard probe --all-profiles` and `check-config`: does each
configured PDU or cooling unit give rackguard anything it uses, and through which profile?
"""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from typing import Any

import orjson

from adapters.errors import SourceError
from adapters.sensors.snmp_profiles import candidate_profiles, is_evidence, oid_tuple
from daemon.config import Config
from daemon.config.snmp import SnmpSourceConfig
from policies.model import Quality, Reading

EXIT_NOTHING_READ = 2
EXIT_FAILED = 1
# check-config waits at most this long for a device: it checks a file, not a network.
CHECK_TIMEOUT_S = 5.0


def _read_kinds(readings: list[Reading]) -> str:
    """'inlet_temperature x2, power x3': the evidence a poll read GOOD, by kind."""
    good = Counter(
        r.kind.value for r in readings if r.quality is Quality.GOOD and is_evidence(r.kind, r.unit)
    )
    return ", ".join(f"{kind} x{n}" for kind, n in sorted(good.items())) or "nothing"


async def survey(config: Config, name: str, *, as_json: bool) -> int:
    """Try every profile the source could use on its device; print which reads what.

    Exit 0 when at least one profile reads evidence, else 2.
    """
    from daemon.service.sources import build_snmp_adapter  # noqa: PLC0415

    cfg = config.sources[name]
    assert isinstance(cfg, SnmpSourceConfig)
    try:
        adapter = build_snmp_adapter(name, cfg)
        async with asyncio.timeout(max(cfg.timeout_s, 5.0) * 4):
            results = await adapter.survey()
    except (SourceError, TimeoutError) as err:
        print(f"rackguard: probe of {name!r} failed: {err or 'timed out'}", file=sys.stderr)
        return EXIT_FAILED
    try:
        sys_oid = oid_tuple(adapter.sys_object_id)
    except ValueError:
        sys_oid = ()
    profiles = [trial.profile for trial, _ in results]
    order = {p.id: i for i, p in enumerate(candidate_profiles(profiles, sys_oid, cfg.profile))}
    rows: list[dict[str, Any]] = []
    for trial, readings in results:
        p = trial.profile
        rows.append(
            {
                "profile": p.id,
                "candidate": order.get(p.id),
                "matches": "fallback" if p.fallback else bool(p.matches(sys_oid)),
                "found": trial.found,
                "polled": trial.polled,
                "good": sum(r.quality is Quality.GOOD for r in readings),
                "evidence": _read_kinds(readings),
            }
        )
    rows.sort(key=lambda r: (r["candidate"] is None, r["candidate"] or 0, r["profile"]))
    print(
        f"rackguard: {name}: sysObjectID {adapter.sys_object_id or '(none)'}"
        f" ({adapter.sys_descr[:60]!r})",
        file=sys.stderr,
    )
    if as_json:
        sys.stdout.write(orjson.dumps(rows, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print(_table(rows))
    if not any(r["evidence"] != "nothing" for r in rows):
        print(f"rackguard: {name}: no profile reads anything rackguard uses", file=sys.stderr)
        return EXIT_NOTHING_READ
    return 0


def _table(rows: list[dict[str, Any]]) -> str:
    header = ("TRY", "PROFILE", "MATCHES", "FOUND", "POLLED", "GOOD", "EVIDENCE READ")
    lines = [header]
    for r in rows:
        tried = "-" if r["candidate"] is None else str(r["candidate"] + 1)
        matches = {True: "yes", False: "no"}.get(r["matches"], str(r["matches"]))
        counts = (str(r["found"]), str(r["polled"]), str(r["good"]))
        lines.append((tried, r["profile"], matches, *counts, r["evidence"]))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line[:-1], widths, strict=True)) + "  " + line[-1]
        for line in lines
    )


async def _check_one(name: str, cfg: SnmpSourceConfig) -> tuple[str, str]:
    """(problem, note) for one SNMP source: what its profile reads from the device."""
    from daemon.service.sources import build_snmp_adapter  # noqa: PLC0415

    try:
        adapter = build_snmp_adapter(name, cfg)
        try:
            async with asyncio.timeout(min(cfg.timeout_s, CHECK_TIMEOUT_S)):
                await adapter.connect()
                await adapter.read()
        finally:
            await adapter.close()
    except (SourceError, TimeoutError) as err:
        why = str(err) or f"no answer within {min(cfg.timeout_s, CHECK_TIMEOUT_S):g}s"
        return "", f"sources.{name}: device not reached, its profile not checked (offline): {why}"
    if adapter.degraded_reason:
        return f"sources.{name}.profile: {adapter.degraded_reason}", ""
    assert adapter.profile is not None
    note = f"sources.{name}: profile {adapter.profile.id} reads this device"
    if adapter.missing:
        note += f" (not: {', '.join(adapter.missing)})"
    return "", note


async def snmp_source_problems(config: Config) -> tuple[list[str], list[str]]:
    """(problems, notes) of every SNMP source, checked on its device where reachable."""
    sources = [(n, c) for n, c in config.sources.items() if isinstance(c, SnmpSourceConfig)]
    results = await asyncio.gather(*(_check_one(n, c) for n, c in sources))
    return [p for p, _ in results if p], [n for _, n in results if n]
