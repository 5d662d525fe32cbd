"""Crash test: ``kill -9`` the delivering process ten times while 100 decisions flow.

The driver (this module run as a script) does what the daemon does: it opens
the outbox on a database file, runs delivery to a Slurm sink (the REST write
path, against a fake slurmrestd in the test process) and submits the policy's
decisions one by one. A restarted driver continues with the decisions the
outbox has not seen yet, as a restarted daemon's policy would go on deciding.
After the last restart every intended node state must be in the scheduler, and
no write may have been applied twice (a write that changed nothing).
"""

from __future__ import annotations

import asyncio
import random
import re
import sys
from pathlib import Path

from adapters.schedulers.slurm.auth import JwtToken
from adapters.schedulers.slurm.client import SlurmClient
from adapters.schedulers.slurm.sink import SlurmSink
from fakes.slurmrestd import FakeNode, FakeSlurmrestd
from policies.model import REASON_PREFIX, Action, Decision, FaultDomain, idempotency_key
from tests.support.delivery import StoreAndDeliverer as Outbox
from tests.support.paths import ROOT
from tests.support.secrets import write_secret

NODES = tuple(f"gpu{i:02d}" for i in range(1, 7))
DECISIONS = 100
KILLS = 10


def in_state(node: FakeNode, action: Action) -> bool:
    """Slurm shows the node where ``action`` puts it (DOWN may keep a DRAIN flag)."""
    if action is Action.DRAIN:
        return "DRAIN" in node.flags
    if action is Action.EXCLUDE:
        return node.base == "DOWN"
    return node.base == "IDLE" and "DRAIN" not in node.flags


def plan() -> list[Decision]:
    """The policy's decisions, the same in every process."""
    rng = random.Random(1234)
    out = []
    for i in range(DECISIONS):
        node = rng.choice(NODES)
        action = rng.choice(list(Action))
        out.append(
            Decision(
                node,
                action,
                f"{REASON_PREFIX} crash test #{i}",
                FaultDomain.GPU,
                float(i),
                idempotency_key(node, action, i),
            )
        )
    return out


async def drive(db: str, url: str, token_file: str) -> None:
    """The driver process: deliver, submit what is left, print DONE once all is confirmed."""
    sink = SlurmSink(
        SlurmClient(url, token=JwtToken(Path(token_file)), timeout_s=2.0), exclude_state="down"
    )
    outbox = Outbox(db, sink, retry_initial_s=0.01, retry_max_s=0.05)
    delivery = asyncio.create_task(outbox.run())
    first = await outbox.store.submitted_count()
    print(f"START {first}", flush=True)
    rng = random.Random()
    for d in plan()[first:]:
        outbox.submit(d)
        await asyncio.sleep(rng.uniform(0.01, 0.05))
    settled = asyncio.Event()
    outbox.on_settled = lambda *_: settled.set()
    while outbox.pending():
        settled.clear()
        await settled.wait()
    print("DONE", flush=True)
    delivery.cancel()
    await asyncio.gather(delivery, return_exceptions=True)
    await sink.close()
    outbox.close()


async def _spawn(db: Path, url: str, token_file: Path) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.daemon.delivery.test_outbox_crash",
        str(db),
        url,
        str(token_file),
        cwd=ROOT,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
    )


async def _read_start(proc: asyncio.subprocess.Process) -> int:
    assert proc.stdout is not None
    async with asyncio.timeout(30):
        line = (await proc.stdout.readline()).decode()
    assert line.startswith("START "), f"driver said {line!r}"
    return int(line.split()[1])


async def test_kill_9_ten_times_loses_no_decision_and_applies_none_twice(tmp_path: Path) -> None:
    fake = FakeSlurmrestd(NODES, tokens={"root": "token-root"})
    await fake.start()
    token_file = tmp_path / "jwt"
    write_secret(token_file, "token-root\n")
    db = tmp_path / "outbox.sqlite3"
    rng = random.Random()
    starts: list[int] = []
    writes_at_kill: list[int] = []
    try:
        for _ in range(KILLS):
            proc = await _spawn(db, fake.url, token_file)
            try:
                starts.append(await _read_start(proc))
                await asyncio.sleep(rng.uniform(0.02, 0.35))
            finally:
                if proc.returncode is None:
                    proc.kill()  # SIGKILL: no cleanup, mid-transaction or mid-request
                await proc.wait()
            writes_at_kill.append(len(fake.writes))
        proc = await _spawn(db, fake.url, token_file)
        try:
            starts.append(await _read_start(proc))
            assert proc.stdout is not None
            async with asyncio.timeout(60):
                last = (await proc.stdout.readline()).decode().strip()
            assert last == "DONE"
            assert await proc.wait() == 0
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    finally:
        await fake.stop()

    # The kills really interrupted the flow: later runs started further on.
    assert starts[0] == 0 and starts[-1] <= DECISIONS
    assert starts[-2] < DECISIONS, f"all decisions were in before the last kill: {starts}"
    assert len(set(starts)) >= 4, starts
    # None lost: each node is where the newest decision about it puts it.
    intended: dict[str, Action] = {}
    for d in plan():
        intended[d.node] = d.action
    wrong = {n: (a, fake.nodes[n].held()) for n, a in intended.items()}
    wrong = {n: v for n, v in wrong.items() if not in_state(fake.nodes[n], v[0])}
    assert not wrong, f"intended vs scheduler: {wrong}"
    for node, action in intended.items():
        if action is not Action.RESUME:
            # A DOWN+DRAIN node already satisfies a later drain: the exclusion's reason stays.
            reason = fake.nodes[node].reason
            assert re.match(r"rackguard\[gpu\]: (exclude: )?crash test #", reason), reason
    # None applied twice: every write the scheduler accepted changed the node.
    repeated = [w for w in fake.writes if w.before == w.after]
    assert not repeated, repeated
    assert fake.writes, "nothing was written at all"


if __name__ == "__main__":
    asyncio.run(drive(*sys.argv[1:4]))
