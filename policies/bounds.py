"""Setting fields that carry their own numeric bounds and documentation, as field metadata.

Pure (dataclasses only): the policy's settings are defined with it in
``policies/settings.py`` and the daemon's typed TOML loader checks the bounds
and names the key when a value falls outside them.
"""

from __future__ import annotations

import dataclasses
from typing import Any


def bounded(
    default: Any = dataclasses.MISSING,
    *,
    gt: float | None = None,
    ge: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    doc: str = "",
) -> Any:
    """A dataclass field with numeric bounds (checked on load) and a one-line description."""
    meta: dict[str, Any] = {
        k: v for k, v in {"gt": gt, "ge": ge, "le": le, "lt": lt}.items() if v is not None
    }
    if doc:
        meta["doc"] = doc
    if isinstance(default, list | dict):
        factory = type(default)
        return dataclasses.field(default_factory=lambda: factory(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)
