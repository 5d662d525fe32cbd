"""The trace format: JSON lines of readings (and decisions), as replay reads and writes them.

One JSON object per line, each with a ``type``:

* ``header`` (first line): ``format`` = "rackguard-trace", ``version`` = 1, ``racks``
  (rack name -> its node names) and free-form ``meta``.
* ``reading``: one :class:`~policies.model.Reading` — ``source``, ``sensor``, ``kind``,
  ``value`` (null when BAD), ``unit``, ``quality``, ``mono``, ``wall``, and when set
  ``reason``, ``device_ts`` and ``labels``. GPU readings carry label ``node``;
  rack readings (inlet air, PDU, coolant) label ``rack``.
* ``decision``: one :class:`~policies.model.Decision` with its evidence, plus
  ``mono``, the evaluation time that made it.

Encoding and decoding are pure string functions; files are the caller's business.
Floats are written by ``repr``, so a value read back is the value written.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from policies.model import (
    Action,
    Assessment,
    Condition,
    Decision,
    FaultDomain,
    Quality,
    Reading,
    SensorKind,
)

FORMAT = "rackguard-trace"
VERSION = 1


class TraceError(ValueError):
    """A line that is not valid trace data; the message names the line number."""


@dataclass(frozen=True, slots=True)
class Header:
    """The first line: the topology the readings belong to."""

    racks: Mapping[str, tuple[str, ...]]
    meta: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, slots=True)
class TracedDecision:
    """A decision as recorded, with the evaluation time that made it."""

    decision: Decision
    mono: float


def _dumps(obj: Mapping[str, Any]) -> str:
    return json.dumps(obj, separators=(",", ":"), allow_nan=False, ensure_ascii=False)


def encode_header(racks: Mapping[str, Iterable[str]], meta: Mapping[str, Any] | None = None) -> str:
    """The header line."""
    return _dumps(
        {
            "type": "header",
            "format": FORMAT,
            "version": VERSION,
            "racks": {rack: list(nodes) for rack, nodes in racks.items()},
            "meta": dict(meta or {}),
        }
    )


def reading_dict(r: Reading) -> dict[str, Any]:
    """A reading as a JSON-ready mapping."""
    d: dict[str, Any] = {
        "type": "reading",
        "source": r.source,
        "sensor": r.sensor,
        "kind": r.kind.value,
        "value": r.value,
        "unit": r.unit,
        "quality": r.quality.value,
        "mono": r.mono,
        "wall": r.wall,
    }
    if r.reason:
        d["reason"] = r.reason
    if r.device_ts is not None:
        d["device_ts"] = r.device_ts
    if r.server_ts is not None:
        d["server_ts"] = r.server_ts
    if r.labels:
        d["labels"] = dict(r.labels)
    return d


def encode_reading(r: Reading) -> str:
    """One reading line."""
    return _dumps(reading_dict(r))


def assessment_dict(a: Assessment) -> dict[str, Any]:
    """An assessment as a JSON-ready mapping (None fields left out)."""
    d: dict[str, Any] = {
        "subject": a.subject,
        "domain": a.domain.value,
        "condition": a.condition.value,
        "at": a.at,
    }
    for name in ("value", "unit", "threshold", "trend_per_min", "time_to_threshold_s", "detail"):
        v = getattr(a, name)
        if v is not None and v != "":
            d[name] = v
    return d


def decision_dict(d: Decision, mono: float | None = None) -> dict[str, Any]:
    """A decision (and the evaluation time that made it) as a JSON-ready mapping."""
    out: dict[str, Any] = {
        "type": "decision",
        "node": d.node,
        "action": d.action.value,
        "reason": d.reason,
        "domain": d.domain.value,
        "at": d.at,
        "key": d.key,
        "dry_run": d.dry_run,
        "evidence": [assessment_dict(a) for a in d.evidence],
    }
    if mono is not None:
        out["mono"] = mono
    return out


def encode_decision(d: Decision, mono: float | None = None) -> str:
    """One decision line."""
    return _dumps(decision_dict(d, mono))


def _num(obj: Mapping[str, Any], key: str, line: int, *, optional: bool = False) -> float | None:
    v = obj.get(key)
    if v is None and optional:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise TraceError(f"line {line}: {key} must be a number, got {v!r}")
    try:
        number = float(v)
    except OverflowError:  # an integer too large for a float
        raise TraceError(f"line {line}: non-finite number in {key}") from None
    if not math.isfinite(number):
        raise TraceError(f"line {line}: non-finite number in {key}")
    return number


def _str(obj: Mapping[str, Any], key: str, line: int, default: str | None = None) -> str:
    v = obj.get(key, default)
    if not isinstance(v, str):
        raise TraceError(f"line {line}: {key} must be a string, got {v!r}")
    return v


def _labels(obj: Mapping[str, Any], line: int) -> Mapping[str, str]:
    raw = obj.get("labels", {})
    if not isinstance(raw, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in raw.items()
    ):
        raise TraceError(f"line {line}: labels must map strings to strings")
    return MappingProxyType(raw)


def decode_reading(obj: Mapping[str, Any], line: int = 0) -> Reading:
    """A reading from its mapping; TraceError names what is wrong."""
    try:
        kind = SensorKind(_str(obj, "kind", line))
        quality = Quality(_str(obj, "quality", line))
        value = _num(obj, "value", line, optional=True)
        mono = _num(obj, "mono", line)
        wall = _num(obj, "wall", line)
        assert mono is not None and wall is not None
        return Reading(
            source=_str(obj, "source", line),
            sensor=_str(obj, "sensor", line),
            kind=kind,
            value=value,
            unit=_str(obj, "unit", line, ""),
            quality=quality,
            mono=mono,
            wall=wall,
            reason=_str(obj, "reason", line, ""),
            device_ts=_num(obj, "device_ts", line, optional=True),
            server_ts=_num(obj, "server_ts", line, optional=True),
            labels=_labels(obj, line),
        )
    except TraceError:
        raise
    except ValueError as err:
        raise TraceError(f"line {line}: {err}") from None


def decode_decision(obj: Mapping[str, Any], line: int = 0) -> TracedDecision:
    """A recorded decision from its mapping."""
    try:
        evidence = tuple(
            Assessment(
                subject=_str(a, "subject", line),
                domain=FaultDomain(_str(a, "domain", line)),
                condition=Condition(_str(a, "condition", line)),
                at=_num(a, "at", line) or 0.0,
                value=_num(a, "value", line, optional=True),
                unit=_str(a, "unit", line, ""),
                threshold=_num(a, "threshold", line, optional=True),
                trend_per_min=_num(a, "trend_per_min", line, optional=True),
                time_to_threshold_s=_num(a, "time_to_threshold_s", line, optional=True),
                detail=_str(a, "detail", line, ""),
            )
            for a in obj.get("evidence", [])
        )
        d = Decision(
            node=_str(obj, "node", line),
            action=Action(_str(obj, "action", line)),
            reason=_str(obj, "reason", line),
            domain=FaultDomain(_str(obj, "domain", line)),
            at=_num(obj, "at", line) or 0.0,
            key=_str(obj, "key", line),
            evidence=evidence,
            dry_run=bool(obj.get("dry_run", False)),
        )
        return TracedDecision(d, _num(obj, "mono", line, optional=True) or 0.0)
    except TraceError:
        raise
    except (ValueError, TypeError, AttributeError) as err:
        raise TraceError(f"line {line}: {err}") from None


def decode_header(obj: Mapping[str, Any], line: int = 1) -> Header:
    """The header from its mapping."""
    if obj.get("format") != FORMAT:
        raise TraceError(f"line {line}: not a {FORMAT} header (format {obj.get('format')!r})")
    if obj.get("version") != VERSION:
        raise TraceError(f"line {line}: unsupported trace version {obj.get('version')!r}")
    racks = obj.get("racks")
    if not isinstance(racks, dict) or not all(
        isinstance(nodes, list) and all(isinstance(n, str) for n in nodes)
        for nodes in racks.values()
    ):
        raise TraceError(f"line {line}: racks must map rack names to lists of node names")
    meta = obj.get("meta", {})
    return Header(
        MappingProxyType({str(k): tuple(v) for k, v in racks.items()}),
        MappingProxyType(dict(meta) if isinstance(meta, dict) else {}),
    )


def parse(lines: Iterable[str]) -> tuple[Header, Iterator[Reading | TracedDecision]]:
    """The header and an iterator over the records after it; blank lines are skipped."""
    it = iter(enumerate(lines, 1))
    for number, text in it:
        if text.strip():
            header = decode_header(_loads(text, number), number)
            break
    else:
        raise TraceError("empty trace: no header line")

    def records() -> Iterator[Reading | TracedDecision]:
        for n, line in it:
            if not line.strip():
                continue
            obj = _loads(line, n)
            kind = obj.get("type")
            if kind == "reading":
                yield decode_reading(obj, n)
            elif kind == "decision":
                yield decode_decision(obj, n)
            else:
                raise TraceError(f"line {n}: unknown record type {kind!r}")

    return header, records()


class _NonFinite(ValueError):
    pass


def _no_constant(token: str) -> float:
    raise _NonFinite(token)


def _finite_float(token: str) -> float:
    value = float(token)
    if not math.isfinite(value):  # 1e999 parses as inf
        raise _NonFinite(token)
    return value


def _loads(text: str, line: int) -> dict[str, Any]:
    # json.loads takes NaN, Infinity and overflowing numbers by default; a trace never
    # holds them (a value that is not a number is a BAD reading with value null).
    try:
        obj = json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)
    except _NonFinite as err:
        raise TraceError(f"line {line}: non-finite number {err}") from None
    except json.JSONDecodeError as err:
        raise TraceError(f"line {line}: not JSON: {err.msg}") from None
    if not isinstance(obj, dict):
        raise TraceError(f"line {line}: expected a JSON object")
    return obj
