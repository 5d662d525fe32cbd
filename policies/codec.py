"""JSON data and JSON Schemas derived from the model's dataclasses, by msgspec.

The dataclasses of :mod:`policies.model` are the one definition of a reading,
an assessment and a decision. Their plain-data form (:func:`to_data`), their
validated construction from plain data (:func:`from_data`) and their JSON
Schemas (:func:`schema_components`) all come from those dataclasses, so a field
added there appears everywhere at once. The wire forms (HTTP API, webhook,
trace) are that data less what :data:`WIRE_OMITS` names, and nothing else.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Any, TypeVar

import msgspec

from policies.model import Assessment, Decision

T = TypeVar("T")

# What the wire (HTTP API, webhook) leaves out: an assessment's ``at`` is this
# node's monotonic clock, meaningless anywhere else. The outbox keeps it.
WIRE_OMITS: Mapping[type, tuple[str, ...]] = MappingProxyType({Assessment: ("at",)})


def _builtin(obj: Any) -> Any:
    if isinstance(obj, MappingProxyType):  # frozen labels
        return dict(obj)
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


def to_data(obj: Any) -> Any:
    """A model object (or a structure of them) as dicts, lists, strings and numbers."""
    return msgspec.to_builtins(obj, enc_hook=_builtin)


def from_data(data: Any, cls: type[T]) -> T:
    """A model object from plain data; ValueError says which field is wrong and why."""
    try:
        return msgspec.convert(data, cls)
    except msgspec.ValidationError as err:
        raise ValueError(str(err)) from None


def assessment_wire(a: Assessment) -> dict[str, Any]:
    """An assessment as the API and the webhook send it."""
    data: dict[str, Any] = to_data(a)
    for name in WIRE_OMITS[Assessment]:
        del data[name]
    return data


def decision_wire(d: Decision) -> dict[str, Any]:
    """A decision as the API and the webhook send it (``evidence`` last, as it always was)."""
    data: dict[str, Any] = to_data(d)
    evidence = data.pop("evidence")
    for item in evidence:
        for name in WIRE_OMITS[Assessment]:
            del item[name]
    data["evidence"] = list(evidence)
    return data


def schema_components(
    types: Iterable[type], ref_template: str = "#/components/schemas/{name}"
) -> dict[str, Any]:
    """JSON Schemas of ``types`` and of every type they use, by name, as the wire has them."""
    _, components = msgspec.json.schema_components(tuple(types), ref_template=ref_template)
    omitted = {cls.__name__: WIRE_OMITS[cls] for cls in WIRE_OMITS}
    optional = {cls.__name__: unset_fields(cls) for cls in models_in(types)}
    for name, schema in components.items():
        if "properties" not in schema:
            continue  # an enum
        for field in omitted.get(name, ()):
            del schema["properties"][field]
        # The encoder writes every field, defaults included, except one left UNSET.
        maybe = optional.get(name, ())
        schema["required"] = [f for f in schema["properties"] if f not in maybe]
    return dict(components)


def _fields(cls: type) -> tuple[msgspec.inspect.Field, ...]:
    info = msgspec.inspect.type_info(cls)
    if not isinstance(info, msgspec.inspect.DataclassType | msgspec.inspect.StructType):
        raise TypeError(f"{cls.__name__} is not a model dataclass or Struct")
    return info.fields


def unset_fields(cls: type) -> tuple[str, ...]:
    """The fields of a model that may be left out: those whose default is msgspec.UNSET."""
    # msgspec.inspect shows an UNSET default as "not required, and no default".
    no = msgspec.NODEFAULT
    return tuple(
        f.name
        for f in _fields(cls)
        if not f.required and f.default is no and f.default_factory is no
    )


def _is_model(t: Any) -> bool:
    return isinstance(t, type) and (dataclasses.is_dataclass(t) or issubclass(t, msgspec.Struct))


def models_in(types: Iterable[Any]) -> Iterator[type]:
    """Every model (dataclass or Struct) in ``types`` and in their fields' types, once each."""
    seen: set[type] = set()
    todo = list(types)
    while todo:
        t = todo.pop()
        todo.extend(typing.get_args(t))
        if _is_model(t) and t not in seen:
            seen.add(t)
            todo.extend(typing.get_type_hints(t, include_extras=True).values())
            yield t


def field_names(cls: type) -> tuple[str, ...]:
    """The fields of a model dataclass (or Struct), in order."""
    return tuple(f.name for f in _fields(cls))


def required_fields(cls: type) -> frozenset[str]:
    """The fields of a model dataclass (or Struct) that have no default."""
    return frozenset(f.name for f in _fields(cls) if f.required)
