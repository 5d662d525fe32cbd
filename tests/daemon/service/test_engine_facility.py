"""The engine logs what the pure policy returns as data: absent sensors once, rack transitions."""

from __future__ import annotations

import logging

import pytest

from daemon.service.engine import PolicyEngine
from daemon.service.state import StateStore
from policies.model import Decision, Quality, Reading, SensorKind
from policies.settings import PolicySettings


def _gpu(t: float) -> list[Reading]:
    labels = {"gpu": "0"}
    return [
        Reading(
            "gpus",
            "gpu0.temperature",
            SensorKind.GPU_TEMPERATURE,
            60.0,
            "celsius",
            Quality.GOOD,
            t,
            1e9 + t,
            labels=labels,
        ),
        Reading(
            "gpus",
            "gpu0.slowdown_threshold",
            SensorKind.GPU_SLOWDOWN_THRESHOLD,
            90.0,
            "celsius",
            Quality.GOOD,
            t,
            1e9 + t,
            labels=labels,
        ),
    ]


def _pdu(t: float, inlet: float) -> list[Reading]:
    return [
        Reading(
            "pdu",
            "inlet.top",
            SensorKind.INLET_TEMPERATURE,
            inlet,
            "celsius",
            Quality.GOOD,
            t,
            1e9 + t,
            labels={"probe": "top"},
        ),
        Reading(
            "pdu",
            "inlet.slot4",
            SensorKind.INLET_TEMPERATURE,
            None,
            "celsius",
            Quality.ABSENT,
            t,
            1e9 + t,
            reason="no probe fitted",
            labels={"probe": "slot4"},
        ),
    ]


def test_absent_sensor_logged_once_and_rack_transitions_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = StateStore()
    decided: list[Decision] = []
    engine = PolicyEngine("n1", PolicySettings(), store, decided.append, rack="r1")
    caplog.set_level(logging.DEBUG, logger="daemon.service.engine")
    for k in range(10):
        store.update("gpus", _gpu(float(k)))
        store.update("pdu", _pdu(float(k), 24.0 if k < 5 else 33.0))
        engine.evaluate_once(float(k), 1e9 + k)
    absent = [r for r in caplog.records if "absent" in r.getMessage()]
    assert len(absent) == 1 and "pdu/inlet.slot4" in absent[0].getMessage()
    assert absent[0].levelno == logging.WARNING
    racks = [r.getMessage() for r in caplog.records if ": rack r1 " in r.getMessage()]
    # Healthy (the absent slot does not make the air unknown), then past its limit.
    assert racks[0].startswith("n1: rack r1 ok")
    assert any("critical" in m and "at or above its limit 32C" in m for m in racks[1:])
    assert len(racks) == 2
    assert decided and decided[0].action.value == "exclude"
