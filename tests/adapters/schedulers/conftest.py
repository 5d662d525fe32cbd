"""Fixtures of the real-Slurm tests (marked ``slurm``: one 22.05 cluster and one 24.11
cluster per session) and the Kubernetes tests' service-account token."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from fakes.slurmrestd import FakeSlurmrestd
from tests.support.paths import ROOT
from tests.support.secrets import write_secret
from tests.support.slurm import NODES, Cluster, free_ports
from tests.support.slurm24 import Slurm24, start, stop


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """Install (if needed) and start Slurm for this session; stop it afterwards."""
    if os.geteuid() != 0:
        pytest.skip("the real-Slurm tests run as root (munged, slurmctld, slurmd); CI does")
    install = subprocess.run(
        [str(ROOT / "scripts/install-slurm.sh")],
        check=False,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert install.returncode == 0, install.stderr
    # Under /tmp: every parent must be traversable by nobody (slurmrestd).
    work = Path(tempfile.mkdtemp(prefix="rg-slurm-", dir="/tmp"))
    work.chmod(0o755)
    ctld, rest, *slurmd = free_ports(2 + len(NODES))
    env = dict(
        os.environ,
        SLURM_CI_NODES=str(len(NODES)),
        SLURM_CI_CTLD_PORT=str(ctld),
        SLURM_CI_REST_PORT=str(rest),
        SLURM_CI_SLURMD_BASE_PORT=str(slurmd[0]),
    )
    started = subprocess.run(
        [str(ROOT / "scripts/start-slurm.sh"), str(work)],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    try:
        assert started.returncode == 0, started.stderr
        values = dict(line.split("=", 1) for line in started.stdout.split())
        conf = Path(values["SLURM_CONF"])
        yield Cluster(
            work,
            conf,
            values["SLURM_REST_URL"],
            Path(values["SLURM_JWT_FILE"]),
            dict(os.environ, SLURM_CONF=str(conf)),
        )
    finally:
        subprocess.run(
            [str(ROOT / "scripts/stop-slurm.sh"), str(work)],
            check=False,
            env=dict(os.environ, SLURM_CI_PURGE="1"),
            capture_output=True,
            timeout=120,
        )


@pytest.fixture
def clean(cluster: Cluster) -> Iterator[Cluster]:
    """Every node back in service after each test."""
    yield cluster
    for node in NODES:
        cluster.scontrol("update", f"nodename={node}", "state=resume", check=False)


@pytest.fixture(scope="session")
def slurm24_cluster() -> Iterator[Slurm24]:
    """Slurm 24.11 in its cached Debian 13 chroot (built on first use) for this session."""
    if os.geteuid() != 0:
        pytest.skip("the real-Slurm tests run as root (chroot, munged, slurmctld); CI does")
    # Under /tmp, world-traversable, as for 22.05 (the daemons' own files live in the tree).
    work = Path(tempfile.mkdtemp(prefix="rg-slurm24-", dir="/tmp"))
    work.chmod(0o755)
    try:
        yield start(work)
    finally:
        stop(work)


@pytest.fixture
def slurm24(slurm24_cluster: Slurm24) -> Iterator[Slurm24]:
    """The 24.11 cluster; every job cancelled and every node resumed after each test."""
    yield slurm24_cluster
    slurm24_cluster.cancel_all()
    for node in NODES:
        slurm24_cluster.cluster.scontrol("update", f"nodename={node}", "state=resume", check=False)


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    """The token the fake Kubernetes API server accepts, in a private file."""
    path = tmp_path / "token"
    write_secret(path, "test-token\n")
    return path


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlurmrestd]:
    """The fake slurmrestd (Slurm 24.11's API versions) on loopback."""
    server = FakeSlurmrestd()
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
def slurm_token(tmp_path: Path) -> Path:
    """A JWT file the fake slurmrestd takes (root's)."""
    path = tmp_path / "jwt"
    write_secret(path, "token-root\n")
    return path
