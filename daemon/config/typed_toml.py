"""Turn parsed TOML into frozen dataclasses, naming the key path of every problem.

A schema is a tree of frozen dataclasses. Field types may be str, int, float,
bool, Path, Literal[...], X | None, list[X], tuple[X, ...], dict[str, X] and
nested dataclasses. A dataclass with a ``type`` field whose annotation is a
Literal may be one arm of a tagged union (``A | B``): the ``type`` key picks it.
Range limits come from field metadata made by :func:`bounded` (policies/bounds.py,
so the pure policy's own settings carry theirs).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin, get_type_hints

from policies.bounds import bounded

__all__ = ["ConfigError", "bounded", "load_typed"]

T = TypeVar("T")

# What a config's validate() yields: (key path, message) for each problem.
Problems = Iterator[tuple[str, str]]


class ConfigError(Exception):
    """One or more problems, each as ``key.path: message``."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _type_name(tp: Any) -> str:
    if tp is type(None):
        return "nothing"
    if get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if dataclasses.is_dataclass(tp):
        return "a table"
    return {str: "a string", int: "an integer", float: "a number", bool: "true or false"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


def _describe(value: Any) -> str:
    kinds = {bool: "boolean", int: "integer", float: "number", str: "string"}
    kind = kinds.get(type(value), "table" if isinstance(value, dict) else type(value).__name__)
    if isinstance(value, list):
        kind = "array"
    return f"{kind} {value!r}" if not isinstance(value, dict | list) else kind


class _Loader:
    def __init__(self) -> None:
        self.problems: list[str] = []

    def fail(self, path: str, message: str) -> None:
        self.problems.append(f"{path or '(top level)'}: {message}")

    def convert(self, tp: Any, value: Any, path: str) -> Any:
        origin = get_origin(tp)
        if origin in (typing.Union, types.UnionType):
            return self._union(tp, value, path)
        if origin is Literal:
            if value in get_args(tp) and type(value) in {type(a) for a in get_args(tp)}:
                return value
            self.fail(path, f"must be {_type_name(tp)}, got {_describe(value)}")
            return None
        if origin in (list, tuple):
            if not isinstance(value, list):
                self.fail(path, f"must be an array, got {_describe(value)}")
                return None
            (item_tp, *_) = get_args(tp)
            items = [self.convert(item_tp, v, _join(path, i)) for i, v in enumerate(value)]
            return tuple(items) if origin is tuple else items
        if origin is dict or origin is Mapping:
            if not isinstance(value, dict):
                self.fail(path, f"must be a table, got {_describe(value)}")
                return None
            _, val_tp = get_args(tp)
            return {k: self.convert(val_tp, v, _join(path, k)) for k, v in value.items()}
        if dataclasses.is_dataclass(tp) and isinstance(tp, type):
            return self.dataclass(tp, value, path)
        return self._scalar(tp, value, path)

    def _scalar(self, tp: Any, value: Any, path: str) -> Any:
        ok: bool
        if tp is bool:
            ok = isinstance(value, bool)
        elif tp is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif tp is float:
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            value = float(value) if ok else value
            if ok and not math.isfinite(value):
                # TOML allows inf and nan; no setting of ours means either.
                self.fail(path, f"must be a finite number, got {value}")
                return None
        elif tp is str:
            ok = isinstance(value, str)
        elif tp is Path:
            if isinstance(value, str) and value:
                return Path(value)
            self.fail(path, f"must be a file path (a non-empty string), got {_describe(value)}")
            return None
        else:  # pragma: no cover - a schema bug, not a user error
            raise TypeError(f"unsupported config type {tp!r} at {path}")
        if not ok:
            self.fail(path, f"must be {_type_name(tp)}, got {_describe(value)}")
            return None
        return value

    def _union(self, tp: Any, value: Any, path: str) -> Any:
        arms = [a for a in get_args(tp) if a is not type(None)]
        if value is None:
            return None
        tagged = [a for a in arms if dataclasses.is_dataclass(a)]
        if len(arms) == 1:
            return self.convert(arms[0], value, path)
        if tagged and len(tagged) == len(arms):
            return self._tagged(tagged, value, path)
        raise TypeError(f"unsupported union {tp!r} at {path}")  # pragma: no cover

    def _tagged(self, arms: list[Any], value: Any, path: str) -> Any:
        by_tag: dict[str, Any] = {}
        for arm in arms:
            (tag,) = get_args(get_type_hints(arm)["type"])
            by_tag[tag] = arm
        if not isinstance(value, dict):
            self.fail(path, f"must be a table, got {_describe(value)}")
            return None
        tag = value.get("type")
        if not isinstance(tag, str) or tag not in by_tag:
            choices = ", ".join(repr(t) for t in sorted(by_tag))
            self.fail(_join(path, "type"), f"must be one of {choices}, got {tag!r}")
            return None
        return self.dataclass(by_tag[tag], value, path)

    def dataclass(self, cls: type[Any], value: Any, path: str) -> Any:
        if not isinstance(value, dict):
            self.fail(path, f"must be a table, got {_describe(value)}")
            return None
        hints = get_type_hints(cls)
        fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
        for key in value:
            if key not in fields:
                known = ", ".join(sorted(fields))
                self.fail(_join(path, key), f"unknown key (known keys here: {known})")
        kwargs: dict[str, Any] = {}
        before = len(self.problems)
        for name, f in fields.items():
            sub = _join(path, name)
            if name not in value:
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    self.fail(sub, "required key is missing")
                continue
            converted = self.convert(hints[name], value[name], sub)
            if converted is not None:
                self._check_bounds(f, converted, sub)
            kwargs[name] = converted
        if len(self.problems) > before:
            return None
        obj = cls(**kwargs)
        check = getattr(obj, "validate", None)
        if check is not None:
            for key, message in check():
                self.fail(_join(path, key), message)
        return obj

    def _check_bounds(self, f: dataclasses.Field[Any], value: Any, path: str) -> None:
        if not isinstance(value, int | float) or isinstance(value, bool):
            return
        m = f.metadata
        if "gt" in m and not value > m["gt"]:
            self.fail(path, f"must be greater than {m['gt']}, got {value}")
        if "ge" in m and not value >= m["ge"]:
            self.fail(path, f"must be at least {m['ge']}, got {value}")
        if "lt" in m and not value < m["lt"]:
            self.fail(path, f"must be less than {m['lt']}, got {value}")
        if "le" in m and not value <= m["le"]:
            self.fail(path, f"must be at most {m['le']}, got {value}")


def load_typed(cls: type[T], data: Mapping[str, Any]) -> T:
    """Build ``cls`` from parsed TOML; raise ConfigError listing every problem."""
    loader = _Loader()
    obj = loader.dataclass(cls, dict(data), "")
    if loader.problems:
        raise ConfigError(loader.problems)
    return typing.cast(T, obj)
