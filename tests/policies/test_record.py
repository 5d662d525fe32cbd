"""Records (the policy's hot immutable values): fields in constructor order, value semantics."""

from __future__ import annotations

import pytest

from policies import native
from policies.forecast import TimeToThreshold, Trend
from policies.record import Record
from policies.window import Bucket

# Each record with distinct arguments of its fields' types.
EXAMPLES: tuple[tuple[type[Record], tuple[object, ...]], ...] = (
    (Bucket, (1.0, 2.0, 3, 0.5, 2.5)),
    (Trend, (0.1, 0.05, 0.2, 40.0, 100.0, 7, 60.0)),
    (TimeToThreshold, (30.0, 20.0, None)),
)


@pytest.mark.parametrize(("cls", "args"), EXAMPLES, ids=[c.__name__ for c, _ in EXAMPLES])
def test_fields_are_the_constructor_arguments_in_order(
    cls: type[Record], args: tuple[object, ...]
) -> None:
    r = cls(*args)
    assert len(cls.FIELDS) == len(args)
    assert r.astuple() == args
    assert tuple(getattr(r, name) for name in cls.FIELDS) == args
    shown = ", ".join(f"{n}={a!r}" for n, a in zip(cls.FIELDS, args, strict=True))
    assert repr(r) == f"{cls.__name__}({shown})"


def test_equal_and_hashed_by_value_within_one_class() -> None:
    a, same, other = (
        Bucket(1.0, 2.0, 3, 0.5, 2.5),
        Bucket(1.0, 2.0, 3, 0.5, 2.5),
        Bucket(1.0, 2.0, 4, 0.5, 2.5),
    )
    assert a == same and hash(a) == hash(same) and len({a, same}) == 1
    assert a != other
    # Same values, another class: not equal (a tuple of the values is not a record either).
    assert TimeToThreshold(1.0, 2.0, 3.0) != Trend(1.0, 2.0, 3.0, 0.0, 0.0, 0, 0.0)
    assert TimeToThreshold(1.0, 2.0, 3.0) != (1.0, 2.0, 3.0)


def test_no_other_attribute() -> None:
    b = Bucket(1.0, 2.0, 3, 0.5, 2.5)
    with pytest.raises(AttributeError):
        b.colour = "red"  # type: ignore[attr-defined]


@pytest.mark.skipif(not native.COMPILED, reason="the sources leave this to mypy (Final fields)")
def test_fields_are_read_only_in_the_compiled_build() -> None:
    b = Bucket(1.0, 2.0, 3, 0.5, 2.5)
    with pytest.raises(AttributeError):
        b.t = 5.0  # type: ignore[misc]
