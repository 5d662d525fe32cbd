"""Validate a response body against a component schema of the served OpenAPI document."""

from __future__ import annotations

from typing import Any

from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from daemon.http.openapi import OPENAPI

_BASE = "urn:rackguard:openapi"


def _validator(pointer: str) -> Draft202012Validator:
    """A validator for the schema at ``pointer`` in the document, its $refs resolved there."""
    resource: Resource[Any] = DRAFT202012.create_resource(OPENAPI)
    registry: Registry[Any] = Registry().with_resource(_BASE, resource)
    return Draft202012Validator({"$ref": f"{_BASE}#{pointer}"}, registry=registry)


def validator(schema_name: str) -> Draft202012Validator:
    """A validator for one component schema."""
    return _validator(f"/components/schemas/{schema_name}")


def _check(v: Draft202012Validator, body: Any) -> None:
    errors = sorted(v.iter_errors(body), key=str)
    assert not errors, [f"{list(e.absolute_path)}: {e.message}" for e in errors[:5]]


def check(schema_name: str, body: Any) -> None:
    """Assert ``body`` matches the schema, listing the first few mismatches."""
    _check(validator(schema_name), body)


def check_response(path: str, method: str, status: int, body: Any) -> None:
    """Assert ``body`` matches what the document says ``method path`` answers with ``status``."""
    route = path.split("?", 1)[0]
    responses = OPENAPI["paths"][route][method.lower()]["responses"]
    assert str(status) in responses, f"{method} {route} does not declare {status}"
    escaped = route.replace("~", "~0").replace("/", "~1")
    response = f"/paths/{escaped}/{method.lower()}/responses/{status}"
    _check(_validator(f"{response}/content/application~1json/schema"), body)
