"""Against a real Slurm 22.05 (Debian 12): slurmctld, four slurmd, slurmrestd with JWT.

The REST read path and the scontrol write path, through the outbox and the
reconciler exactly as the daemon uses them: drain, exclude, resume, a node an
administrator drained left alone, and a node resumed by hand drained again.
The cluster is installed (apt) and started once per session by the project's
scripts, on free ports, and stopped at the end.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from adapters.schedulers.base import NodeView
from adapters.schedulers.slurm.auth import JwtToken
from adapters.schedulers.slurm.client import SlurmClient
from adapters.schedulers.slurm.sink import SlurmSink
from daemon.delivery.outbox import Status
from daemon.delivery.reconcile import Finding, Reconciler
from policies.model import REASON_PREFIX, Action
from tests.support.delivery import StoreAndDeliverer as Outbox
from tests.support.secrets import write_secret
from tests.support.slurm import NODES, Cluster, decision, deliver_all
from tests.support.wait import wait_for_result, wait_until

pytestmark = pytest.mark.slurm


@pytest.fixture
async def sink(clean: Cluster) -> AsyncIterator[SlurmSink]:
    s = SlurmSink(
        SlurmClient(
            clean.rest_url, token=JwtToken(clean.token_file), slurm_conf=clean.conf, timeout_s=20.0
        ),
        exclude_state="down",
    )
    yield s
    await s.close()


@pytest.fixture
def outbox(tmp_path: Path, sink: SlurmSink) -> Iterator[Outbox]:
    box = Outbox(tmp_path / "outbox.sqlite3", sink, retry_initial_s=0.05, retry_max_s=0.2)
    yield box
    box.close()


async def test_rest_reads_nodes_and_writes_fall_back_to_scontrol(sink: SlurmSink) -> None:
    views = await sink.read_state([*NODES, "gpu99"])
    assert [views[n].exists for n in NODES] == [True] * 4
    assert not any(views[n].held for n in NODES)
    assert views["gpu99"].exists is False
    assert sink.client.info is not None
    # 22.05 serves v0.0.36-38 and no node POST: writes must go through scontrol.
    assert sink.client.info.versions[-1] == "v0.0.38" and sink.client.info.node_write == ()
    one = await sink.read_state(["gpu01"])
    assert one["gpu01"].detail.startswith("IDLE")


async def test_drain_exclude_and_resume_through_the_outbox(clean: Cluster, outbox: Outbox) -> None:
    await deliver_all(outbox, decision("gpu01", Action.DRAIN))
    shown = clean.show("gpu01")
    assert "State=IDLE+DRAIN" in shown and "Reason=rackguard[gpu]: real slurm drain #1" in shown
    await deliver_all(outbox, decision("gpu01", Action.EXCLUDE, 2))
    assert "State=DOWN" in clean.show("gpu01")
    await deliver_all(outbox, decision("gpu01", Action.RESUME, 3))
    shown = clean.show("gpu01")
    assert "DRAIN" not in shown and "DOWN" not in shown.split("Reason=")[0]
    assert [r.status for r in (await outbox.history())] == [Status.CONFIRMED] * 3
    assert outbox.confirmed == {"gpu01": Action.RESUME}


async def test_a_drain_by_an_administrator_is_left_alone(clean: Cluster, outbox: Outbox) -> None:
    clean.scontrol("update", "nodename=gpu02", "state=drain", "reason=maint ticket-1")
    await deliver_all(outbox, decision("gpu02", Action.EXCLUDE))
    await deliver_all(outbox, decision("gpu02", Action.RESUME, 2))
    shown = clean.show("gpu02")
    assert "State=IDLE+DRAIN" in shown and "Reason=maint ticket-1" in shown
    assert [r.status for r in (await outbox.history())] == [Status.SKIPPED, Status.SKIPPED]


async def test_a_node_resumed_by_hand_is_drained_again_by_reconciliation(
    clean: Cluster, outbox: Outbox, sink: SlurmSink
) -> None:
    clean.scontrol("update", "nodename=gpu04", "state=drain", "reason=maint ticket-2")
    await deliver_all(outbox, decision("gpu03", Action.DRAIN), decision("gpu04", Action.DRAIN))
    clean.scontrol("update", "nodename=gpu03", "state=resume")  # an operator, by hand
    assert "DRAIN" not in clean.show("gpu03").split("Reason=")[0]
    reconciler = Reconciler(outbox.store, sink, interval_s=0.1)
    findings = {f.node: f.finding for f in await reconciler.reconcile_once()}
    assert findings == {"gpu03": Finding.DRIFTED, "gpu04": Finding.FOREIGN}
    await deliver_all(outbox)
    assert "Reason=rackguard[gpu]: real slurm drain #1" in clean.show("gpu03")
    assert "Reason=maint ticket-2" in clean.show("gpu04")
    again = {f.node: f.finding for f in await reconciler.reconcile_once()}
    assert again == {"gpu03": Finding.IN_SYNC, "gpu04": Finding.FOREIGN}


async def test_unknown_node_is_retried_until_an_operator_registers_it(outbox: Outbox) -> None:
    task = asyncio.create_task(outbox.run())
    try:
        outbox.submit(decision("gpu99", Action.DRAIN))
        await wait_until(lambda: outbox.deliverer.refusal, timeout=60)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert "does not know this node" in outbox.deliverer.refusal
    assert [p.decision.node for p in outbox.pending()] == ["gpu99"] and not outbox.failed


async def test_a_rejected_token_is_refreshed_by_the_command(clean: Cluster, tmp_path: Path) -> None:
    stale = tmp_path / "jwt"
    write_secret(stale, "not-a-valid-token\n")
    command = ["env", f"SLURM_CONF={clean.conf}", "scontrol", "token", "lifespan=600"]
    token = JwtToken(stale, refresh_command=command)
    sink = SlurmSink(
        SlurmClient(clean.rest_url, token=token, slurm_conf=clean.conf, timeout_s=20.0)
    )
    try:
        views = await sink.read_state(["gpu01"])
    finally:
        await sink.close()
    assert views["gpu01"].exists and token.refreshes == 1


def test_scontrol_output_parses_like_rest(clean: Cluster) -> None:
    from adapters.schedulers.slurm.listing import listed_scontrol  # noqa: PLC0415
    from adapters.schedulers.slurm.sink import parse_scontrol_node  # noqa: PLC0415

    clean.scontrol("update", "nodename=gpu02", "state=drain", f"reason={REASON_PREFIX} x y")
    view = parse_scontrol_node(clean.show("gpu02"))
    assert view is not None and view.drained and view.reason == f"{REASON_PREFIX} x y"
    # 22.05 prints Comment= and Extra= after Reason=: the reason stops before them.
    clean.scontrol("update", "nodename=gpu02", "comment=see Reason=x [y] too", "extra=e1")
    try:
        line = clean.show("gpu02")
        view = parse_scontrol_node(line)
        listed = listed_scontrol(line, view or NodeView(""))
    finally:
        clean.scontrol("update", "nodename=gpu02", "comment=", "extra=", check=False)
    assert view is not None and view.reason == f"{REASON_PREFIX} x y", line
    assert listed.reason_at is not None and abs(listed.reason_at - time.time()) < 3600


async def test_reads_through_scontrol_without_rest(clean: Cluster) -> None:
    sink = SlurmSink(SlurmClient(None, slurm_conf=clean.conf, timeout_s=20.0))

    async def down_and_read() -> dict[str, NodeView]:
        # ReturnToService=2 lets a slurmd that re-registers (one a previous test's
        # job restarted) clear an admin DOWN: set it again until it holds.
        clean.scontrol("update", "nodename=gpu01", "state=down", "reason=rackguard: down test")
        return dict(await sink.read_state(["gpu01", "gpu02", "gpu99"]))

    try:
        views = await wait_for_result(
            down_and_read, lambda v: v["gpu01"].down, timeout=20, what="gpu01 read as DOWN"
        )
    finally:
        await sink.close()
    assert views["gpu01"].down and views["gpu01"].ours
    assert not views["gpu02"].held and not views["gpu99"].exists
