"""The latest-reading store: updates, and what a reload does to a source's series."""

from __future__ import annotations

import time

from daemon.service.state import StateStore
from policies.model import Quality, Reading, SensorKind


def reading(source: str, sensor: str, value: float = 1.0) -> Reading:
    return Reading(
        source,
        sensor,
        SensorKind.TEMPERATURE,
        value,
        "celsius",
        Quality.GOOD,
        time.monotonic(),
        time.time(),
    )


def test_removed_source_is_forgotten_and_changed_source_is_kept_until_it_reports() -> None:
    store = StateStore()
    store.update("gpus", [reading("gpus", "gpu0.t"), reading("gpus", "gpu1.t")])
    store.update("pdu", [reading("pdu", "inlet.top")])
    gen = store.generation

    store.drop_source("pdu")
    assert set(store.latest()) == {"gpus/gpu0.t", "gpus/gpu1.t"}
    assert not store.reported("pdu")
    assert store.generation > gen  # caches of derived views see the change

    store.replace_on_next_update("gpus")
    assert set(store.latest()) == {"gpus/gpu0.t", "gpus/gpu1.t"}  # state kept meanwhile
    store.update("gpus", [reading("gpus", "gpu0.t", 2.0)])  # gpu1 left the config
    assert set(store.latest()) == {"gpus/gpu0.t"}
    store.update("gpus", [reading("gpus", "gpu0.t", 3.0)])
    assert store.latest()["gpus/gpu0.t"].value == 3.0
