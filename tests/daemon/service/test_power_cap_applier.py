"""The cap decisions applied through DirectNvmlLimiter on the fake NVML, durable in the store."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from adapters.sensors.power_limit import DirectNvmlLimiter
from daemon.delivery.outbox import DecisionStore
from daemon.http.cap_ladder_metrics import CapLadderCollector
from daemon.service.power_cap import PowerCaps
from daemon.service.power_limit import WatchedLimiter
from fakes.nvml import fake_node
from policies.power_cap import CapAction, CapDecision, CapLadder, CapState

NODE = "gpu-node-02"


def _caps(store: DecisionStore, fake: object) -> PowerCaps:
    limiter = WatchedLimiter(DirectNvmlLimiter(fake, name="power-cap"))
    return PowerCaps(NODE, limiter, store, CapLadder())


def _scrape(caps: PowerCaps) -> str:
    registry = CollectorRegistry()
    registry.register(CapLadderCollector(caps))
    return generate_latest(registry).decode()


def _decision(action: CapAction, watts: float) -> CapDecision:
    return CapDecision(NODE, "3", action, watts, 700.0, "rackguard: test", 0.0, "k")


async def test_power_cap_survives_the_store_reopened_and_restores_to_before(
    tmp_path: Path,
) -> None:
    fake = fake_node(count=4)
    fake.privileged = True
    store = DecisionStore(tmp_path / "o.sqlite3")
    first = _caps(store, fake)
    await first.step()  # reads the limits: the ladder learns each GPU's constraints
    assert first.ladder.limits[(NODE, "3")].min_w == 200.0
    first.ladder.states[(NODE, "3")] = CapState(NODE, "3", 450.0, 700.0, 0.0, "margin")
    first.take([_decision(CapAction.CAP, 450.0)])
    await first.step()
    assert fake.gpus[3].power_limit_w == 450.0
    assert [r.set_by for r in first.status()] == ["", "", "", "rackguard"]
    await first.limiter.close()
    store.close()

    # A restart: the store reopened, a fresh ladder.
    store = DecisionStore(tmp_path / "o.sqlite3")
    try:
        again = _caps(store, fake)
        assert await again.load() == 1
        state = again.ladder.states[(NODE, "3")]
        assert (state.limit_w, state.before_w, state.cause) == (450.0, 700.0, "margin")
        await again.step()
        assert fake.gpus[3].power_limit_w == 450.0  # not set twice, not lost
        # The last restore step: back to the limit before, and the row is gone.
        del again.ladder.states[(NODE, "3")]
        again.take([_decision(CapAction.RESTORE, 700.0)])
        await again.step()
        assert fake.gpus[3].power_limit_w == 700.0
        assert await _caps(store, fake).load() == 0
        await again.limiter.close()
    finally:
        store.close()


async def test_power_cap_refused_limit_forgets_the_cap_so_the_drain_goes_ahead(
    tmp_path: Path,
) -> None:
    fake = fake_node(count=2)
    fake.privileged = False  # NVML_ERROR_NO_PERMISSION on the set
    store = DecisionStore(tmp_path / "o.sqlite3")
    try:
        caps = _caps(store, fake)
        await caps.step()
        caps.ladder.states[(NODE, "1")] = CapState(NODE, "1", 300.0, 700.0, 0.0, "margin")
        caps.take([CapDecision(NODE, "1", CapAction.CAP, 300.0, 700.0, "rackguard: t", 0.0, "k")])
        await caps.step()
        assert caps.ladder.states == {} and caps.failures == 1
        assert fake.gpus[1].power_limit_w == 700.0
        assert await _caps(store, fake).load() == 0
        text = _scrape(caps)
        assert "rackguard_gpu_power_cap_failures_total 1.0" in text
        await caps.limiter.close()
    finally:
        store.close()


async def test_power_cap_capped_seconds_counted_for_rackguards_caps(tmp_path: Path) -> None:
    fake = fake_node(count=1)
    fake.privileged = True
    store = DecisionStore(tmp_path / "o.sqlite3")
    clock = [100.0]
    try:
        caps = PowerCaps(
            "n",
            WatchedLimiter(DirectNvmlLimiter(fake, name="power-cap")),
            store,
            CapLadder(),
            mono=lambda: clock[0],
        )
        await caps.step()
        caps.ladder.states[("n", "0")] = CapState("n", "0", 300.0, 700.0, 0.0, "loop")
        clock[0] = 112.5
        await caps.step()
        text = _scrape(caps)
        assert 'rackguard_gpu_capped_seconds_total{gpu="0"} 12.5' in text
        await caps.limiter.close()
    finally:
        store.close()
