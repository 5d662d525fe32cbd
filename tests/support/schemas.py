"""One check that all of a model's fields are in its schema (the model's tests and the API's)."""

from __future__ import annotations

from typing import Any


def assert_fields_in_schema(
    name: str, sent: list[str], schema: dict[str, Any], required: list[str]
) -> None:
    """Every field sent is a property of ``schema``, and exactly ``required`` are required."""
    assert sent, name
    missing = [f for f in sent if f not in schema.get("properties", {})]
    assert not missing, f"{name}: fields missing from the schema: {missing}"
    extra = [p for p in schema["properties"] if p not in sent]
    assert not extra, f"{name}: properties no field sends: {extra}"
    assert set(schema["required"]) == set(required), name
