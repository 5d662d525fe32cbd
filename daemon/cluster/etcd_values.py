"""Every value rackguard reads from etcd, as one typed model, and the count of those that fail.

Anything in etcd may have been written by a peer of another version, by hand,
or by whoever else can reach etcd: each value is decoded here or not at all.
Unknown fields are ignored (a newer peer may add some); a missing field, a
wrong type, non-UTF-8 or a node name that could not be one is a bad value:
ignored, counted per kind (``rackguard_etcd_bad_values_total``) and logged
once per key and revision. A bad value never counts a node and never moves one.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from typing import Any, TypeVar

import msgspec

from daemon.cluster.etcd import Kv

log = logging.getLogger(__name__)

# A node name as schedulers spell them (Slurm NodeName, a Kubernetes node's DNS name).
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")


class Cause(msgspec.Struct, frozen=True):
    """cause/<rack>/<node>: this node is out for a rack-wide cause."""

    domain: str


class Breaker(msgspec.Struct, frozen=True):
    """breaker: the fleet's storm breaker, open."""

    trips: int
    by: str


class Caps(msgspec.Struct, frozen=True):
    """caps/<node>: the watts this node's GPUs give up to rackguard's power caps."""

    watts: float


class PublishedReading(msgspec.Struct, frozen=True):
    """One reading in a rack leader's publication; ``age``: seconds old when published."""

    source: str
    sensor: str
    kind: str
    value: float | None
    unit: str
    quality: str
    age: float
    wall: float
    reason: str = ""
    device_ts: float | None = None
    server_ts: float | None = None
    labels: dict[str, str] = msgspec.field(default_factory=dict)


class Evidence(msgspec.Struct, frozen=True):
    """evidence/<rack>/<source>: a rack leader's latest poll of a rack source.

    ``by`` and ``lease``: the publisher and the lease it led under (checked
    against the leader key); ``wall``: its clock at publication, for the log only.
    """

    by: str
    lease: int
    wall: float
    readings: list[PublishedReading]


T = TypeVar("T")

_decoders: dict[type[Any], msgspec.json.Decoder[Any]] = {
    t: msgspec.json.Decoder(t) for t in (Cause, Breaker, Evidence, Caps)
}


class Values:
    """Decodes values read from etcd; counts and logs (once per key revision) those that fail."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.bad: Counter[str] = Counter()  # kind -> bad values seen
        self._logged: dict[str, int] = {}  # key -> mod_revision logged

    def node_name(self, kv: Kv, kind: str) -> str | None:
        """A slot's holder (a node name), or None when the value is not one."""
        try:
            name = kv.value.decode()
        except UnicodeDecodeError:
            self.bad_value(kv, kind, "not UTF-8")
            return None
        if NODE_NAME.fullmatch(name) is None:
            self.bad_value(kv, kind, f"not a node name: {name[:64]!r}")
            return None
        return name

    def decode(self, kv: Kv, model: type[T], kind: str) -> T | None:
        """The value as ``model``, or None (counted, logged once) when it is not one."""
        try:
            value: T = _decoders[model].decode(kv.value)
        except (msgspec.DecodeError, UnicodeDecodeError) as err:
            self.bad_value(kv, kind, str(err)[:200])
            return None
        return value

    def key_part(self, kv: Kv, part: str, kind: str) -> str | None:
        """A node or rack name taken from a key, or None when it could not be one."""
        if NODE_NAME.fullmatch(part) is None:
            self.bad_value(kv, kind, f"not a name in the key: {part[:64]!r}")
            return None
        return part

    def bad_value(self, kv: Kv, kind: str, why: str) -> None:
        """Count and log (once per key revision) a value that is not what we write."""
        if self._logged.get(kv.key) != kv.mod_revision:
            if len(self._logged) > 10_000:  # a flood of junk keys: forget, do not grow
                self._logged.clear()
            self._logged[kv.key] = kv.mod_revision
            self.bad[kind] += 1
            log.warning(
                "%s: ignoring a bad %s value in etcd at %r (revision %d): %s",
                self.node,
                kind,
                kv.key[:200],
                kv.mod_revision,
                why,
            )
