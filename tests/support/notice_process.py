"""A stand-in for the daemon's delivery half, run as its own process so a test can ``kill -9`` it.

``python -m tests.support.notice_process OUTBOX SLURM_CONF NODE GRACE_S [ACTION]``
opens the decision store at OUTBOX, delivers ACTION (drain / exclude) for NODE
to Slurm through scontrol if given, and carries the job notices exactly as the
daemon wires them, until killed.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path

from adapters.schedulers.slurm.client import SlurmClient
from adapters.schedulers.slurm.jobs import SlurmJobs
from adapters.schedulers.slurm.sink import SlurmSink
from daemon.delivery.deliverer import Deliverer
from daemon.delivery.notices import JobNotices, NoticeSettings
from daemon.delivery.outbox import DecisionStore
from policies.model import Action
from tests.support.delivery import decision


async def main(outbox: str, conf: str, node: str, grace_s: float, action: str) -> None:
    store = DecisionStore(outbox)
    sink = SlurmSink(
        SlurmClient(None, slurm_conf=Path(conf), timeout_s=20.0), exclude_state="drain"
    )
    deliverer = Deliverer(store, sink, retry_initial_s=0.05, retry_max_s=0.5)
    settings = NoticeSettings(checkpoint_grace_s=grace_s, critical_grace_s=grace_s)
    notices = JobNotices(store, SlurmJobs(sink.client), settings)
    deliverer.on_settled = notices.settled
    if action:
        store.submit(decision(node, Action(action)))
    async with asyncio.TaskGroup() as tg:
        tg.create_task(store.run())
        tg.create_task(deliverer.run())
        tg.create_task(notices.run())


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    args = sys.argv[1:]
    asyncio.run(main(args[0], args[1], args[2], float(args[3]), args[4] if len(args) > 4 else ""))
