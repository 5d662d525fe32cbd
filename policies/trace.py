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
from typing import Any, Literal, overload

import msgspec

from policies.codec import from_data, required_fields, to_data
from policies.model import Assessment, Decision, Reading

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
    # json.dumps writes floats by repr: the trace's bytes stay what they always were.
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


def _unset(value: Any) -> bool:
    # What a trace leaves out: None, an empty string, an empty mapping (never 0 or False).
    return value is None or (isinstance(value, str | dict) and not value)


def reading_dict(r: Reading) -> dict[str, Any]:
    """A reading as a JSON-ready mapping: the model's fields, unset optional ones left out."""
    data: dict[str, Any] = to_data(r)
    labels = data.pop("labels")  # last, where the trace has always had it
    d: dict[str, Any] = {"type": "reading"}
    for name, value in data.items():
        if name in _REQUIRED_READING or not _unset(value):
            d[name] = value
    if labels:
        d["labels"] = labels
    return d


def encode_reading(r: Reading) -> str:
    """One reading line."""
    return _dumps(reading_dict(r))


def _assessment_data(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k in _REQUIRED_ASSESSMENT or not _unset(v)}


def assessment_dict(a: Assessment) -> dict[str, Any]:
    """An assessment as a JSON-ready mapping (None fields left out)."""
    return _assessment_data(to_data(a))


def decision_dict(d: Decision, mono: float | None = None) -> dict[str, Any]:
    """A decision (and the evaluation time that made it) as a JSON-ready mapping."""
    data: dict[str, Any] = to_data(d)
    evidence = data.pop("evidence")
    out: dict[str, Any] = {"type": "decision", **data}
    out["evidence"] = [_assessment_data(a) for a in evidence]
    if mono is not None:
        out["mono"] = mono
    return out


def encode_decision(d: Decision, mono: float | None = None) -> str:
    """One decision line."""
    return _dumps(decision_dict(d, mono))


_REQUIRED_READING = required_fields(Reading)
_REQUIRED_ASSESSMENT = required_fields(Assessment)
# What a trace line may leave out beyond the model's own defaults.
_READING_DEFAULTS: Mapping[str, Any] = MappingProxyType({"value": None, "unit": ""})
_NUMBERS = ("value", "mono", "wall", "device_ts", "server_ts")


def _finite(obj: Mapping[str, Any], names: Iterable[str], line: int) -> None:
    for name in names:
        v = obj.get(name)
        if isinstance(v, float) and not math.isfinite(v):
            raise TraceError(f"line {line}: non-finite number in {name}")
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) > _MAX_FLOAT_INT:
            raise TraceError(f"line {line}: non-finite number in {name}")


_MAX_FLOAT_INT = int(1.7976931348623157e308)


def decode_reading(obj: Mapping[str, Any], line: int = 0) -> Reading:
    """A reading from its mapping; TraceError names what is wrong."""
    _finite(obj, _NUMBERS, line)
    try:
        return from_data({**_READING_DEFAULTS, **obj}, Reading)
    except ValueError as err:
        raise TraceError(f"line {line}: {err}") from None


def decode_decision(obj: Mapping[str, Any], line: int = 0) -> TracedDecision:
    """A recorded decision from its mapping."""
    mono = obj.get("mono")
    _finite(obj, ("at", "mono"), line)
    try:
        decision = from_data(obj, Decision)
        if mono is not None and (isinstance(mono, bool) or not isinstance(mono, int | float)):
            raise ValueError(f"mono must be a number, got {mono!r}")
    except ValueError as err:
        raise TraceError(f"line {line}: {err}") from None
    return TracedDecision(decision, float(mono or 0.0))


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


# The lines this package writes: decoded straight into a Reading, the common case.
_READING_PREFIX = '{"type":"reading",'
_READING_PREFIX_BYTES = _READING_PREFIX.encode()
_READING_DECODER = msgspec.json.Decoder(Reading)

# Lines as text, or as the bytes of a file opened in binary (what replay reads: its
# lines come about twice as fast as through a text decoder, and a reading's line is
# decoded from its bytes as cheaply). Bytes must be UTF-8; a line that is not is a
# TraceError naming it.
Line = str | bytes


def parse(lines: Iterable[Line]) -> tuple[Header, Iterator[Reading | TracedDecision]]:
    """The header and an iterator over the records after it; blank lines are skipped."""
    it = _numbered(lines)
    return _header(it), _records(it, decisions=True)


def parse_readings(lines: Iterable[Line]) -> tuple[Header, Iterator[Reading]]:
    """:func:`parse` less the decision records (still checked, not yielded), as replay reads."""
    it = _numbered(lines)
    return _header(it), _records(it, decisions=False)


def _numbered(lines: Iterable[Line]) -> Iterator[tuple[int, Line]]:
    return iter(enumerate(lines, 1))


def _text(line: Line, number: int) -> str:
    """A line as text; TraceError for bytes that are not UTF-8."""
    if isinstance(line, str):
        return line
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError as err:
        byte = line[err.start]
        raise TraceError(
            f"line {number}: not UTF-8 text (byte 0x{byte:02x} at column {err.start + 1})"
        ) from None


def _header(it: Iterator[tuple[int, Line]]) -> Header:
    for number, line in it:
        text = _text(line, number)
        if text.strip():
            return decode_header(_loads(text, number), number)
    raise TraceError("empty trace: no header line")


@overload
def _records(it: Iterator[tuple[int, Line]], *, decisions: Literal[False]) -> Iterator[Reading]: ...
@overload
def _records(
    it: Iterator[tuple[int, Line]], *, decisions: Literal[True]
) -> Iterator[Reading | TracedDecision]: ...
def _records(
    it: Iterator[tuple[int, Line]], *, decisions: bool
) -> Iterator[Reading | TracedDecision]:
    fast = _READING_DECODER.decode
    for n, line in it:
        if (
            line.startswith(_READING_PREFIX_BYTES)
            if isinstance(line, bytes)
            else line.startswith(_READING_PREFIX)
        ):
            try:
                yield fast(line)
                continue
            except (msgspec.MsgspecError, ValueError):
                pass  # the careful path below names what is wrong, or takes it
        text = _text(line, n)
        if not text.strip():
            continue
        obj = _loads(text, n)
        kind = obj.get("type")
        if kind == "reading":
            yield decode_reading(obj, n)
        elif kind == "decision":
            decision = decode_decision(obj, n)
            if decisions:
                yield decision
        else:
            raise TraceError(f"line {n}: unknown record type {kind!r}")


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
    except _NonFinite as token:
        raise TraceError(f"line {line}: non-finite number {token}") from None
    except json.JSONDecodeError as err:
        raise TraceError(f"line {line}: not JSON: {err.msg}") from None
    if not isinstance(obj, dict):
        raise TraceError(f"line {line}: expected a JSON object")
    return obj
