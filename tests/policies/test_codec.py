"""The codecs and schemas derived from the model: complete, consistent, and the trace's reader."""

from __future__ import annotations

import json

import msgspec
import pytest

from policies.codec import WIRE_OMITS, field_names, from_data, schema_components, to_data
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
from policies.trace import TraceError, encode_header, encode_reading, parse
from tests.support.schemas import assert_fields_in_schema

MODELS = (Reading, Assessment, Decision)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_every_field_of_a_model_is_in_its_schema(model: type) -> None:
    schema = schema_components(MODELS)[model.__name__]
    sent = [f for f in field_names(model) if f not in WIRE_OMITS.get(model, ())]
    assert_fields_in_schema(model.__name__, sent, schema, sent)


def test_a_decision_and_its_evidence_share_one_domain_enum() -> None:
    schemas = schema_components(MODELS)
    ref = {"$ref": "#/components/schemas/FaultDomain"}
    assert schemas["Decision"]["properties"]["domain"] == ref
    assert schemas["Assessment"]["properties"]["domain"] == ref
    assert set(schemas["FaultDomain"]["enum"]) == {d.value for d in FaultDomain}
    assert schemas["Decision"]["properties"]["reason"]["pattern"] == "^rackguard:"


def test_model_data_round_trips() -> None:
    a = Assessment("gpu1", FaultDomain.GPU, Condition.WARNING, 3.0, 80.5, "celsius", 87.0)
    d = Decision("n1", Action.DRAIN, "rackguard: x", FaultDomain.GPU, 1.5, "rg-1", (a,), True)
    assert from_data(json.loads(json.dumps(to_data(d))), Decision) == d
    with pytest.raises(ValueError, match="rackguard:"):
        from_data({**to_data(d), "reason": "x"}, Decision)
    with pytest.raises(ValueError, match="domain"):
        from_data({**to_data(d), "domain": "galaxy"}, Decision)


def _line(**fields: object) -> str:
    base: dict[str, object] = {
        "type": "reading",
        "source": "gpus",
        "sensor": "gpu0.temperature",
        "kind": "gpu_temperature",
        "value": 60.5,
        "unit": "celsius",
        "quality": "good",
        "mono": 1.0,
        "wall": 2.0,
    }
    base.update(fields)
    return json.dumps({k: v for k, v in base.items() if v is not ...}, separators=(",", ":"))


def _read(line: str) -> Reading:
    _, records = parse([encode_header({"r": ["n"]}), line])
    (r,) = list(records)
    assert isinstance(r, Reading)
    return r


def test_the_reader_takes_what_the_format_allows() -> None:
    want = Reading("gpus", "gpu0.temperature", SensorKind.GPU_TEMPERATURE, 60.5, "celsius",
                   Quality.GOOD, 1.0, 2.0)  # fmt: skip
    assert _read(_line()) == want
    assert _read(_line(mono=1, wall=2)) == want  # integers are numbers
    assert _read(_line(unit=...)) == msgspec.structs.replace(want, unit="")  # unit may be left out
    reordered = json.dumps({"kind": "gpu_temperature", **json.loads(_line())})
    assert _read(reordered) == want
    labelled = _read(_line(labels={"node": "n"}))
    assert dict(labelled.labels) == {"node": "n"}
    assert encode_reading(labelled) == _line(labels={"node": "n"})


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"mono": 1e999}, "line 2: non-finite number"),
        ({"value": True}, "line 2: .*value"),
        ({"quality": "excellent"}, "line 2: .*quality"),
        ({"labels": {"node": 1}}, "line 2: .*labels"),
        ({"value": None}, "line 2: gpu0.temperature: a good reading needs a value"),
        ({"sensor": ...}, "line 2: .*sensor"),
    ],
)
def test_the_reader_names_the_line_and_the_field(fields: dict[str, object], message: str) -> None:
    with pytest.raises(TraceError, match=message):
        _read(_line(**fields))
