"""A node's verdict: a restored rack-wide drain waits for the rack's evidence, and one hot
GPU is not a rack-wide event on weak shared evidence."""

from __future__ import annotations

import pytest

from daemon.service.engine import PolicyEngine
from daemon.service.state import StateStore
from policies import rack
from policies.attribution import AirEvidence, LoopEvidence, attribute
from policies.model import Action, FaultDomain
from tests.policies.rack_sim import (
    COOL,
    HEALTHY_CDU,
    ONE_HOT,
    S,
    Sim,
    actions,
)

# -- a restored rack-wide drain waits for the rack's evidence ------------------------


def test_restored_loop_drain_does_not_resume_before_loop_evidence_is_seen() -> None:
    sim = Sim()
    sim.policy.restore("n1", Action.DRAIN, 0.0, domain=FaultDomain.COOLING_LOOP)
    assert sim.policy.states["n1"].domain is FaultDomain.COOLING_LOOP
    # GPUs cool, no CDU readings yet (its source not polled yet after the restart).
    assert sim.run(120, {"n1": COOL, "n2": COOL}) == []
    # The loop is still failing when its readings arrive: n1 stays out (n2, in service,
    # is drained for the lost flow).
    failing = {**HEALTHY_CDU, "pump": 0.0, "flow": 2.0}
    drained = sim.run(120, {"n1": COOL, "n2": COOL}, failing)
    assert actions(drained) == [("n2", Action.DRAIN, FaultDomain.COOLING_LOOP)]
    # Healthy loop: resume after resume_after_s.
    decided = sim.run(60, {"n1": COOL, "n2": COOL}, HEALTHY_CDU)
    assert ("n1", Action.RESUME, FaultDomain.NONE) in actions(decided)


def test_restored_rack_drain_waits_for_inlet_air() -> None:
    sim = Sim()
    sim.policy.restore("n1", Action.EXCLUDE, 0.0, domain=FaultDomain.RACK)
    assert sim.run(120, {"n1": COOL, "n2": COOL}) == []
    decided = sim.run(60, {"n1": COOL, "n2": COOL}, {"inlet": 24.0})
    assert actions(decided) == [("n1", Action.RESUME, FaultDomain.NONE)]


def test_restored_gpu_drain_resumes_on_gpu_evidence_alone() -> None:
    sim = Sim()
    sim.policy.restore("n1", Action.DRAIN, 0.0, domain=FaultDomain.GPU)
    decided = sim.run(60, {"n1": COOL, "n2": COOL})
    assert actions(decided) == [("n1", Action.RESUME, FaultDomain.NONE)]


def test_engine_restore_takes_the_domain() -> None:
    engine = PolicyEngine("n", S, StateStore(), lambda d: None, rack="r1")
    engine.restore(Action.DRAIN, 5.0, domain=FaultDomain.COOLING_LOOP)
    assert engine.state.action is Action.DRAIN
    assert engine.state.domain is FaultDomain.COOLING_LOOP
    assert engine.ledger.view(5.0).out["n"].domain is FaultDomain.COOLING_LOOP


# -- one hot GPU is not a rack-wide event on weak shared evidence ---------------------

LOOP_OK = LoopEvidence(monitored=True, known=True)
RISEN_NO_RATE = LoopEvidence(True, True, supply_rising=True, supply_risen=True, detail="risen")
LOOP_LOST = LoopEvidence(True, True, flow_lost=True, detail="pump stopped")
LEAK = LoopEvidence(True, True, leak=True, detail="leak")
AIR_OK = AirEvidence(True, True)
AIR_WARM = AirEvidence(True, True, 0.01, detail="inlet rising")


@pytest.mark.parametrize(
    ("hot", "loop", "air", "fall", "rack_nodes", "domain"),
    [
        # The reviewer's case: a trusted inlet rise, no GPU trend, one GPU.
        (1, LOOP_OK, AIR_WARM, None, 1, FaultDomain.GPU),
        # A rise that would explain it still needs more than one GPU or node.
        (1, LOOP_OK, AIR_WARM, 0.015, 1, FaultDomain.GPU),
        (2, LOOP_OK, AIR_WARM, 0.015, 1, FaultDomain.RACK),
        (1, LOOP_OK, AIR_WARM, 0.015, 2, FaultDomain.RACK),
        # Unknown margin fall: a rate alone explains nothing.
        (3, LOOP_OK, AIR_WARM, None, 1, FaultDomain.NODE),
        # A material supply rise without a rate: the loop, for several GPUs only.
        (1, RISEN_NO_RATE, AIR_OK, None, 1, FaultDomain.GPU),
        (3, RISEN_NO_RATE, AIR_OK, None, 1, FaultDomain.COOLING_LOOP),
        # Direct evidence names the loop even for one GPU.
        (1, LOOP_LOST, AIR_OK, None, 1, FaultDomain.COOLING_LOOP),
        (1, LEAK, AIR_OK, 0.05, 1, FaultDomain.COOLING_LOOP),
    ],
)
def test_rack_wide_domains_need_broad_evidence(
    hot: int,
    loop: LoopEvidence,
    air: AirEvidence,
    fall: float | None,
    rack_nodes: int,
    domain: FaultDomain,
) -> None:
    got, _ = attribute(
        hot_gpus=hot, loop=loop, air=air, margin_fall_c_per_s=fall, rack_nodes_in_trouble=rack_nodes
    )
    assert got is domain


def test_one_hot_gpu_with_warming_inlet_drains_its_node_only() -> None:
    sim = Sim()
    temps = {"n1": COOL, "n2": COOL}
    for _ in range(240):  # inlet +0.05 C/min, trusted (an exact line beats persistence)
        sim.step(temps, {"inlet": 24.0 + 0.05 * sim.t / 60.0})
    assert rack.air_evidence("r1", sim.policy.tracker.rack["r1"], sim.t - 1, sim.policy.settings)[
        0
    ].rising
    decided = []
    for _ in range(60):
        out = sim.step({"n1": ONE_HOT, "n2": COOL}, {"inlet": 24.0 + 0.05 * sim.t / 60.0})
        decided += [o for o in out.values() if o.decision is not None]
    assert actions(decided) == [("n1", Action.DRAIN, FaultDomain.GPU)]


@pytest.mark.parametrize(("inlet", "resumed"), [(30.5, False), (29.5, True)])
def test_a_rack_drain_resumes_only_with_the_inlet_clear_of_its_limit(
    inlet: float, resumed: bool
) -> None:
    """Flat air 1.5 C under the 32 C limit (no forecast to reach it) keeps a node out for
    the rack's air: resumed there, the probe's next uptick drains it again (crac-slow's
    drain-only run resumed gpu-node-02 0.6 C under the limit and drained it 59 s later)."""
    sim = Sim()
    sim.policy.restore("n1", Action.DRAIN, 0.0, domain=FaultDomain.RACK)
    decided = sim.run(400, {"n1": COOL, "n2": COOL}, {"inlet": inlet})
    assert (("n1", Action.RESUME, FaultDomain.NONE) in actions(decided)) is resumed
