"""Every API body is a model, and every model is complete in /openapi.json.

A field added to a body's dataclass appears in its schema by construction;
these tests fail if that ever stops being true (a hand-written schema creeping
back, a field the schema does not list, a required field that may be left out).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from jsonschema import Draft202012Validator

from daemon.cluster.status import ClusterStatus, EtcdStatus
from daemon.http.bodies import OutboxHealth as OutboxHealthBody
from daemon.http.bodies import Ready, to_wire
from daemon.http.openapi import MODELS, OPENAPI, REQUEST_BODIES, REQUEST_UNIONS
from policies.codec import WIRE_OMITS, field_names, models_in, unset_fields
from tests.support.schemas import assert_fields_in_schema

COMPONENTS: dict[str, Any] = OPENAPI["components"]["schemas"]


def _all_models() -> list[type]:
    found = list(models_in(MODELS))
    return found + [t for t in REQUEST_BODIES if t not in found]


def _name(model: type) -> str:
    return model.__name__


@pytest.mark.parametrize("model", _all_models(), ids=_name)
def test_every_field_of_a_model_is_in_its_schema(model: type) -> None:
    schema = COMPONENTS[model.__name__]
    if model not in REQUEST_BODIES:
        sent = [f for f in field_names(model) if f not in WIRE_OMITS.get(model, ())]
        # A response writes every field but those left UNSET.
        required = [f for f in sent if f not in unset_fields(model)]
    else:
        info = msgspec.inspect.type_info(model)
        assert isinstance(info, msgspec.inspect.StructType)
        # A tagged request's tag is sent and required as its fields are.
        tag = [model.__struct_config__.tag_field] if model.__struct_config__.tag_field else []  # type: ignore[attr-defined]
        sent = tag + [f.name for f in info.fields]
        # A request must send what has no default.
        required = tag + [f.name for f in info.fields if f.required]
    assert_fields_in_schema(model.__name__, sent, schema, required)


def test_the_document_describes_the_bodies_it_has_models_for() -> None:
    # Every served body is a model: a schema of our own has the title msgspec
    # gives the class it was derived from; a hand-written one has none.
    models = {m.__name__ for m in _all_models()} | set(REQUEST_UNIONS)
    for name, schema in COMPONENTS.items():
        assert schema.get("title") == name, f"{name}: not derived from a model"
        assert "enum" in schema or name in models, name


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _refs(item)


def test_every_reference_resolves() -> None:
    refs = set(_refs(OPENAPI))
    assert refs, "no references"
    for ref in refs:
        assert ref.startswith("#/components/schemas/"), ref
        assert ref.removeprefix("#/components/schemas/") in COMPONENTS, ref


def test_unset_is_left_out_and_none_is_null() -> None:
    ready = Ready(True, {"gpus": True}, OutboxHealthBody(True, ""), [], False)
    assert "cluster" not in to_wire(ready)
    cluster = ClusterStatus("etcd", True, etcd=EtcdStatus(False, 2))
    assert to_wire(cluster) == {
        "mode": "etcd",
        "degraded": True,
        "etcd": {"up": False, "failures": 2},
    }


@pytest.mark.parametrize("name", sorted(COMPONENTS))
def test_every_component_is_a_valid_json_schema(name: str) -> None:
    Draft202012Validator.check_schema(COMPONENTS[name])
