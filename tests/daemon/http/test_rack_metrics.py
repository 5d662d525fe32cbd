"""Rack evidence on /metrics: the hottest fresh inlet, the coolant supply, flow against its high."""

from __future__ import annotations

import time
from pathlib import Path

from adapters.sensors.nvml import NvmlAdapter
from daemon.app import Daemon
from daemon.config import parse_config
from fakes.nvml import fake_node
from policies.model import Quality, Reading, SensorKind
from tests.support.daemon_harness import config_text
from tests.support.scrape import samples


def reading(
    source: str, sensor: str, kind: SensorKind, value: float, mono: float, **labels: str
) -> Reading:
    return Reading(source, sensor, kind, value, "", Quality.GOOD, mono, time.time(), labels=labels)


def test_rack_evidence_from_fresh_readings_and_the_flows_sustained_high(
    secret_file: Path,
) -> None:
    cfg = parse_config(config_text("http://127.0.0.1:9/none", secret_file))
    daemon = Daemon(cfg, adapters={"gpus": NvmlAdapter("gpus", fake_node())})
    try:
        now = time.monotonic()
        start = now - 200.0
        # 100 l/min for three minutes (many 10 s buckets), then 40: 40 % of its high.
        for i in range(37):
            t = start + 5.0 * i
            flow = 100.0 if t < now - 10 else 40.0
            daemon.store.update("cdu", [reading("cdu", "flow", SensorKind.COOLANT_FLOW, flow, t)])
            daemon.engine.evaluate_once(t, time.time())
        fresh, stale = now - 2.0, now - 120.0  # rack readings go stale after 30 s
        daemon.store.update(
            "cdu",
            [
                reading("cdu", "flow", SensorKind.COOLANT_FLOW, 40.0, fresh),
                reading("cdu", "supply", SensorKind.COOLANT_SUPPLY_TEMPERATURE, 31.5, fresh),
            ],
        )
        daemon.store.update(
            "pdu",
            [
                reading("pdu", "top", SensorKind.INLET_TEMPERATURE, 27.0, fresh, probe="top"),
                reading("pdu", "bottom", SensorKind.INLET_TEMPERATURE, 23.0, fresh, probe="bottom"),
                reading("pdu", "old", SensorKind.INLET_TEMPERATURE, 45.0, stale, probe="old"),
            ],
        )
        daemon.engine.evaluate_once(now, time.time())
        m = samples(daemon.metrics.render().decode())
        assert m["rackguard_rack_inlet_max_celsius"] == [({"rack": "rack-b"}, 27.0)]
        assert m["rackguard_rack_coolant_supply_celsius"] == [({"rack": "rack-b"}, 31.5)]
        ((labels, ratio),) = m["rackguard_coolant_flow_sustained_high_ratio"]
        assert labels == {"rack": "rack-b", "series": "cdu/flow"}
        assert abs(ratio - 0.4) < 1e-9
        assert m["rackguard_node_info"] == [({"node": "gpu-node-07", "rack": "rack-b"}, 1.0)]
    finally:
        daemon.decisions.close()
