"""A real Slurm cluster for the tests: what start-slurm.sh (22.05) or start-slurm24.sh
(24.11, in a chroot) started, and helpers.

The fixtures that start it live in tests/adapters/schedulers/conftest.py.
"""

from __future__ import annotations

import asyncio
import random
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from policies.model import REASON_PREFIX, Action, Decision, FaultDomain, idempotency_key
from tests.support.delivery import StoreAndDeliverer as Outbox
from tests.support.wait import wait_until

NODES = ("gpu01", "gpu02", "gpu03", "gpu04")


@dataclass(frozen=True)
class Cluster:
    """What start-slurm.sh printed."""

    dir: Path
    conf: Path  # as the Slurm commands see it (inside the chroot for 24.11)
    rest_url: str
    token_file: Path
    env: dict[str, str]
    # Put before every Slurm command: ("chroot", tree) for 24.11.
    prefix: tuple[str, ...] = field(default=())

    def command(self, name: str) -> tuple[str, ...]:
        """A Slurm command as the daemon would be configured to run it here."""
        return (*self.prefix, name)

    def scontrol(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run scontrol against this cluster, as an administrator at the console would."""
        return self.run("scontrol", *args, check=check)

    def run(self, name: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a Slurm command (scontrol, sbatch, squeue, ...) against this cluster."""
        return subprocess.run(
            [*self.command(name), *args],
            env=self.env,
            capture_output=True,
            text=True,
            check=check,
            timeout=30,
        )

    def show(self, node: str) -> str:
        """``scontrol show node`` as one line."""
        return self.scontrol("-o", "show", "node", node).stdout


def free_port(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def free_ports(count: int) -> list[int]:
    """``count`` consecutive free TCP ports (slurmd ports must be consecutive)."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 40000)
        ports = list(range(base, base + count))
        if all(free_port(p) for p in ports):
            return ports
    raise RuntimeError("no free port range")


def decision(node: str, action: Action, epoch: int = 1) -> Decision:
    return Decision(
        node,
        action,
        f"{REASON_PREFIX} real slurm {action} #{epoch}",
        FaultDomain.GPU,
        float(epoch),
        idempotency_key(node, action, epoch),
    )


async def deliver_all(outbox: Outbox, *decisions: Decision) -> None:
    task = asyncio.create_task(outbox.run())
    try:
        for d in decisions:
            outbox.submit(d)
        await wait_until(lambda: not outbox.pending(), timeout=60)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
