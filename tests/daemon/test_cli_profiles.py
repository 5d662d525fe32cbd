"""check-config loads every profile a source would use: exit 0 means probe can load them too.

Each config variant goes through `rackguard check-config`; where it exits 0, `rackguard
probe` of every source runs as a process against real servers (snmpsim serving a
Sentry3 recording over UDP, an asyncua CDU over TCP) and must exit 0; where it exits
2, the message names the source's key and the profile file.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from adapters.sensors.opcua_profiles import PROFILE_FOLDER
from daemon.cli import main
from fakes.cdu_server import FakeCduServer
from fakes.snmp_recording import SnmpsimServer
from tests.support.paths import ROOT
from tests.support.secrets import write_secret

RECORDING = ROOT / "tests" / "fixtures" / "snmp" / "sentry3-fahrenheit.snmprec"
SHIPPED_SNMP = ROOT / "adapters" / "sensors" / "profiles"
SHIPPED_CDU = ROOT / "adapters" / "sensors" / PROFILE_FOLDER


@pytest.fixture(scope="module")
def snmpsim() -> Iterator[SnmpsimServer]:
    server = SnmpsimServer([RECORDING])
    server.start()
    yield server
    server.stop()


@pytest.fixture
async def cdu() -> AsyncIterator[FakeCduServer]:
    server = FakeCduServer(model="generic")
    await server.start()
    yield server
    await server.stop()


def _config(tmp: Path, snmp_port: int, cdu_url: str, snmp: str = "", opcua: str = "") -> Path:
    community = tmp / "community"
    write_secret(community, "sentry3-fahrenheit\n")
    path = tmp / "rackguard.toml"
    path.write_text(
        '[node]\nname = "n1"\n'
        f'[sources.pdu]\ntype = "snmp"\nhost = "127.0.0.1"\nport = {snmp_port}\n'
        f'community_file = "{community}"\n{snmp}\n'
        f'[sources.cdu]\ntype = "opcua"\nurl = "{cdu_url}"\nmode = "poll"\n'
        f"interval_s = 5.0\ntimeout_s = 4.0\n{opcua}\n"
    )
    return path


def _site_dir(tmp: Path, name: str, files: dict[str, str]) -> Path:
    folder = tmp / name
    folder.mkdir()
    for file, text in files.items():
        (folder / file).write_text(text)
    return folder


def _sentry3_copy(pid: str = "sentry3") -> str:
    text = (SHIPPED_SNMP / "sentry3.toml").read_text()
    return text.replace('id = "sentry3"', f'id = "{pid}"', 1)


TYPO = (
    'id = "acme"\nmatch = ["1.3.6.1.4.1.99999"]\n[[table]]\nwalk = "1.3.6.1.4.1.99999.1"\n'
    'field = { name = "1.3.6.1.4.1.99999.1" }\n[[table.sensor]]\nid = "{name}.temperature"\n'
    'value = "1.3.6.1.4.1.99999.2"\nkind = "temperature"\n'
)

GENERIC = (SHIPPED_CDU / "generic.toml").read_text()
TWIN = _sentry3_copy("z")
CDU_TYPO = 'root = "0:CDU"\n[variables.flow]\nkind = "coolant_flow"\npaht = "0:F"\n'

# name -> (extra SNMP keys, extra OPC-UA keys) given tmp; the expected problem or "" for OK.
Variant = Callable[[Path], tuple[str, str]]
VARIANTS: dict[str, tuple[Variant, tuple[str, ...]]] = {
    "shipped profiles": (lambda t: ("", ""), ()),
    "site profiles win": (
        lambda t: (
            f'profile_dir = "{_site_dir(t, "pdu", {"s3.toml": _sentry3_copy()})}"',
            f'profile_dir = "{_site_dir(t, "cdu", {"site-cdu.toml": GENERIC})}"\n'
            'profile = "site-cdu"',
        ),
        (),
    ),
    "a profile file": (
        lambda t: (f'profile = "{_site_dir(t, "f", {"x.toml": _sentry3_copy("x")})}/x.toml"', ""),
        (),
    ),
    "missing profile_dir": (
        lambda t: (f'profile_dir = "{t}/nowhere"', ""),
        ("sources.pdu.profile_dir:", "nowhere"),
    ),
    "unknown snmp profile": (
        lambda t: ('profile = "sentry5"', ""),
        ("sources.pdu.profile:", "no profile 'sentry5'"),
    ),
    "broken profile file": (
        lambda t: (f'profile_dir = "{_site_dir(t, "b", {"bad.toml": "id = "})}"', ""),
        ("sources.pdu.profile_dir:", "bad.toml: not valid TOML"),
    ),
    "mistyped key in a table": (
        lambda t: (f'profile_dir = "{_site_dir(t, "t", {"acme.toml": TYPO})}"', ""),
        ("sources.pdu.profile_dir:", "acme.toml: table[0].field: unknown key"),
    ),
    "duplicate site ids": (
        lambda t: (
            f'profile_dir = "{_site_dir(t, "d", {"a.toml": TWIN, "b.toml": TWIN})}"',
            "",
        ),
        ("sources.pdu.profile_dir:", "b.toml: id 'z' is already defined by"),
    ),
    "unknown cdu profile": (
        lambda t: ("", 'profile = "acme"'),
        ("sources.cdu.profile:", "unknown CDU profile 'acme'"),
    ),
    "broken site cdu profile": (
        lambda t: (
            "",
            f'profile_dir = "{_site_dir(t, "c", {"v.toml": CDU_TYPO})}"\nprofile = "v"',
        ),
        ("sources.cdu.profile", "v.toml: variables.flow.paht: unknown key"),
    ),
    "unknown cdu variable": (
        lambda t: ("", 'nodes = { flux = "ns=2;i=1" }'),
        ("sources.cdu.nodes.flux:", "not a variable of profile"),
    ),
}


async def _probe(config: Path, source: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "daemon.cli", "probe", source, "--config", str(config),
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await proc.communicate()
    return proc.returncode or 0, out.decode() + err.decode()


@pytest.mark.parametrize("variant", sorted(VARIANTS))
async def test_check_config_ok_implies_probe_loads_every_profile(
    variant: str,
    snmpsim: SnmpsimServer,
    cdu: FakeCduServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    make, expected = VARIANTS[variant]
    snmp, opcua = make(tmp_path)
    config = _config(tmp_path, snmpsim.port, cdu.url, snmp, opcua)
    code = await asyncio.to_thread(main, ["check-config", str(config)])
    err = capsys.readouterr().err
    if expected:
        assert code == 2, err
        assert all(part in err for part in expected), err
        return
    assert code == 0, err
    for source in ("pdu", "cdu"):
        rc, output = await _probe(config, source)
        assert rc == 0, output
        assert "Traceback" not in output


async def test_probe_into_a_closed_pipe_ends_quietly(
    snmpsim: SnmpsimServer, cdu: FakeCduServer, tmp_path: Path
) -> None:
    """`rackguard probe pdu | head -1`: the reader is gone before the table is written."""
    config = _config(tmp_path, snmpsim.port, cdu.url)
    read_end, write_end = os.pipe()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "daemon.cli", "probe", "pdu", "--config", str(config),
        cwd=ROOT, stdout=write_end, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    os.close(write_end)
    os.close(read_end)  # like `head` exiting: every write now fails with EPIPE
    _, err = await proc.communicate()
    assert "Traceback" not in err.decode() and "BrokenPipeError" not in err.decode(), err
    assert proc.returncode == 0
