"""The hot dataclasses' written-out __init__ (policies/native.py) is the one dataclass makes."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest

from policies import (
    attribution,
    forecast,
    gradient,
    headroom,
    native,
    policy,
    replay,
    rules,
    window,
)

MODULES = (attribution, forecast, gradient, headroom, policy, replay, rules, window)


def _hot() -> list[type[Any]]:
    """Every dataclass of the compiled modules that writes its own __init__."""
    found = []
    for module in MODULES:
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and dataclasses.is_dataclass(value)
                and value.__module__ == module.__name__
                and not value.__dataclass_params__.init  # type: ignore[attr-defined]
            ):
                found.append(value)
    return found


HOT = _hot()


def test_the_hot_classes_are_found() -> None:
    names = {c.__name__ for c in HOT}
    assert {"Bucket", "Trend", "TimeToThreshold", "NodeState", "Outcome", "Verdict"} <= names


@pytest.mark.skipif(native.COMPILED, reason="inspect reads the signatures of the sources")
@pytest.mark.parametrize("cls", HOT, ids=lambda c: c.__name__)
def test_init_takes_the_fields_in_order_with_their_defaults(cls: type[Any]) -> None:
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    fields = dataclasses.fields(cls)
    assert [p.name for p in params] == [f.name for f in fields]
    for p, f in zip(params, fields, strict=True):
        assert p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD, f.name
        assert f.default_factory is dataclasses.MISSING, f"{f.name}: a factory is not written out"
        want = inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default
        assert p.default == want, f"{cls.__name__}.{f.name}: default {p.default!r}, field {want!r}"


@pytest.mark.parametrize("cls", HOT, ids=lambda c: c.__name__)
def test_each_field_is_set_from_its_argument_and_stays_frozen(cls: type[Any]) -> None:
    fields = dataclasses.fields(cls)
    # A distinct object per field: each must land in its own field, none swapped.
    args = [object() for _ in fields]
    if native.COMPILED:
        pytest.skip("the build checks each argument's type; the sources show the wiring")
    made = cls(*args)
    assert [getattr(made, f.name) for f in fields] == args
    assert dataclasses.replace(made) == made
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(made, fields[0].name, None)
