"""Interop with net-snmp's snmpd (an independent agent): SNMPv3 users, PDU OIDs, bad credentials."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from adapters.errors import SourceAuthError, SourceUnavailable
from adapters.sensors.snmp import SnmpAdapter, SnmpOptions
from adapters.sensors.snmp_client import V2cClient, V3Client, V3Credentials
from daemon.config.snmp import SnmpSourceConfig
from daemon.config.typed_toml import load_typed
from daemon.service.sources import build_snmp_adapter
from fakes.sim import RackSimulator, load_scenario
from fakes.snmp_agent import sentry4_values
from fakes.snmpd import NetSnmpd, override_lines
from policies.model import Quality, SensorKind
from tests.adapters.sensors.test_snmp_faults import stopped_while_closing
from tests.support.secrets import write_secret

USERS = {
    # user: (auth protocol, auth key, priv protocol, priv key) as rackguard names them
    "rgsha": ("sha", b"auth-key-sha1", "aes", b"priv-key-aes128"),
    "rgsha256": ("sha256", b"auth-key-sha256", "aes256", b"priv-key-aes256"),
    "rgsha512": ("sha512", b"auth-key-sha512", "none", b""),
}
_NET_SNMP_NAMES = {"sha": "SHA", "sha256": "SHA-256", "sha512": "SHA-512", "aes": "AES"}
_NET_SNMP_NAMES["aes256"] = "AES-256"


def _user_lines() -> list[str]:
    lines = []
    for user, (auth, auth_key, priv, priv_key) in USERS.items():
        line = f'createUser {user} {_NET_SNMP_NAMES[auth]} "{auth_key.decode()}"'
        if priv != "none":
            line += f' {_NET_SNMP_NAMES[priv]} "{priv_key.decode()}"'
        lines.append(line)
        lines.append(f"rouser {user} {'auth' if priv == 'none' else 'priv'}")
    return lines


@pytest.fixture(scope="module")
def snapshot_values() -> dict[tuple[int, ...], object]:
    sim = RackSimulator(load_scenario("hot-gpu"), seed=3)
    return dict(sentry4_values(sim.snapshot(noise=False)))


@pytest.fixture(scope="module")
def snmpd(snapshot_values: dict[tuple[int, ...], object]) -> Iterator[NetSnmpd]:
    """snmpd serving a Sentry4-shaped PDU (sysObjectID included) through override lines."""
    server = NetSnmpd([*_user_lines(), *override_lines(snapshot_values)])  # type: ignore[arg-type]
    server.start()
    yield server
    server.stop()


def _v3(server: NetSnmpd, account: str, **changes: object) -> SnmpAdapter:
    auth, auth_key, priv, priv_key = USERS[account]
    fields: dict[str, object] = {
        "user": account,
        "auth_protocol": auth,
        "auth_key": auth_key,
        "priv_protocol": priv,
        "priv_key": priv_key,
    }
    fields.update(changes)
    creds = V3Credentials(**fields)  # type: ignore[arg-type]
    client = V3Client("127.0.0.1", server.port, creds, timeout_s=0.5, retries=0)
    return SnmpAdapter(f"pdu-{account}", client, SnmpOptions(poll_deadline_s=3.0))


@pytest.mark.parametrize("user", sorted(USERS))
async def test_snmpv3_users_read_the_pdu(
    snmpd: NetSnmpd, snapshot_values: dict[tuple[int, ...], object], user: str
) -> None:
    adapter = _v3(snmpd, user)
    try:
        await adapter.connect()
        readings = {r.sensor: r for r in await adapter.read()}
    finally:
        await adapter.close()
    assert adapter.profile is not None and adapter.profile.id == "sentry4"
    assert readings and all(r.quality is Quality.GOOD for r in readings.values())
    raw_current = snapshot_values[(1, 3, 6, 1, 4, 1, 1718, 4, 1, 5, 3, 1, 6, 1, 1, 1)]
    assert isinstance(raw_current, int)
    assert readings["phase.L1.current"].value == pytest.approx(raw_current / 100)
    probe = readings["inlet.A1.temperature"]
    assert probe.kind is SensorKind.INLET_TEMPERATURE
    raw_probe = snapshot_values[(1, 3, 6, 1, 4, 1, 1718, 4, 1, 9, 3, 1, 1, 1, 1)]
    assert isinstance(raw_probe, int)
    assert probe.value == pytest.approx(raw_probe / 10)


async def test_snmpv3_a_stop_while_closing_is_not_swallowed(snmpd: NetSnmpd) -> None:
    assert await stopped_while_closing(_v3(snmpd, "rgsha"))


async def test_wrong_auth_key_is_an_auth_error(snmpd: NetSnmpd) -> None:
    adapter = _v3(snmpd, "rgsha", auth_key=b"not-the-auth-key")
    with pytest.raises(SourceAuthError, match="WrongDigest"):
        await adapter.connect()


async def test_unknown_user_is_an_auth_error(snmpd: NetSnmpd) -> None:
    adapter = _v3(snmpd, "rgsha", user="nobody-here")
    with pytest.raises(SourceAuthError, match="UnknownUserName"):
        await adapter.connect()


async def test_wrong_privacy_key_says_so(snmpd: NetSnmpd) -> None:
    adapter = _v3(snmpd, "rgsha", priv_key=b"not-the-priv-key")
    with pytest.raises(SourceUnavailable, match="timeout — or a wrong privacy key"):
        await adapter.connect()


async def test_v2c_against_snmpd(snmpd: NetSnmpd) -> None:
    client = V2cClient("127.0.0.1", snmpd.port, b"public", timeout_s=0.5, retries=0)
    adapter = SnmpAdapter("pdu-v2c", client, SnmpOptions(max_varbinds=4, max_repetitions=4))
    try:
        await adapter.connect()
        readings = await adapter.read()
    finally:
        await adapter.close()
    assert {r.sensor for r in readings} >= {"phase.L2.power", "inlet.A3.temperature"}


async def test_config_builds_a_v3_adapter_from_secret_files(
    snmpd: NetSnmpd, tmp_path: Path
) -> None:
    auth, priv = tmp_path / "auth.key", tmp_path / "priv.key"
    write_secret(auth, USERS["rgsha"][1] + b"\n")
    write_secret(priv, USERS["rgsha"][3] + b"\n")
    cfg = load_typed(
        SnmpSourceConfig,
        {
            "type": "snmp",
            "host": "127.0.0.1",
            "port": snmpd.port,
            "version": "3",
            "user": "rgsha",
            "auth_key_file": str(auth),
            "priv_key_file": str(priv),
            "request_timeout_s": 0.5,
        },
    )
    adapter = build_snmp_adapter("pdu-a", cfg)
    try:
        await adapter.connect()
        assert any(r.sensor == "phase.L3.current" for r in await adapter.read())
    finally:
        await adapter.close()
