"""Record: equality, hashing and repr by field, for the policy's hot immutable values.

A frozen dataclass's ``__init__`` is generated at run time, so it stays interpreted
in the compiled build (``make native``): building one cost about twenty times a
plain compiled class, and a replay builds a bucket, a fit or a time to threshold
hundreds of thousands of times. The hot values are plain classes instead. A
subclass names its fields in ``FIELDS`` (its constructor's order) and uses that as
its ``__slots__``; its ``__init__`` assigns each field once, as ``Final``: mypy
refuses any other assignment, and the compiled build makes them read-only.
"""

from __future__ import annotations

from typing import ClassVar


class Record:
    """Equal to a record of the same class with equal fields; hashed and shown by them."""

    # The compiled build keeps no __slots__ on the class: the names are kept here too.
    FIELDS: ClassVar[tuple[str, ...]] = ()
    __slots__ = ()

    def astuple(self) -> tuple[object, ...]:
        """The field values, in ``FIELDS`` order."""
        return tuple([getattr(self, name) for name in self.FIELDS])

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, Record)
        return self.astuple() == other.astuple()

    def __hash__(self) -> int:
        return hash(self.astuple())

    def __repr__(self) -> str:
        shown = ", ".join(f"{n}={v!r}" for n, v in zip(self.FIELDS, self.astuple(), strict=True))
        return f"{type(self).__name__}({shown})"
