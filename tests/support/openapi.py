"""Validate a response body against a component schema of the served OpenAPI document."""

from __future__ import annotations

from typing import Any

from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from daemon.http.openapi import OPENAPI


def validator(schema_name: str) -> Draft202012Validator:
    """A validator for one component schema, resolving $refs inside the OpenAPI document."""
    resource: Resource[Any] = DRAFT202012.create_resource(OPENAPI)
    registry: Registry[Any] = Registry().with_resource("urn:rackguard:openapi", resource)
    schema = {"$ref": f"urn:rackguard:openapi#/components/schemas/{schema_name}"}
    return Draft202012Validator(schema, registry=registry)


def check(schema_name: str, body: Any) -> None:
    """Assert ``body`` matches the schema, listing the first few mismatches."""
    errors = sorted(validator(schema_name).iter_errors(body), key=str)
    assert not errors, [f"{list(e.absolute_path)}: {e.message}" for e in errors[:5]]


def response_schema(path: str, method: str, status: int) -> str:
    """The component the document names for ``method path`` answering ``status``."""
    route = path.split("?", 1)[0]
    responses = OPENAPI["paths"][route][method.lower()]["responses"]
    response = responses.get(str(status)) or responses["default"]
    ref: str = response["content"]["application/json"]["schema"]["$ref"]
    return ref.removeprefix("#/components/schemas/")


def check_response(path: str, method: str, status: int, body: Any) -> None:
    """Assert ``body`` matches what the document says ``method path`` answers with ``status``."""
    check(response_schema(path, method, status), body)
