"""Errors an operator can act on: wrong community vs nothing listening, v3 hints, bad host names."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from adapters.errors import SourceSetupError, SourceUnavailable
from adapters.sensors.snmp import SnmpAdapter
from adapters.sensors.snmp_client import V2cClient, V3Client, V3Credentials
from fakes.snmp_recording import SnmpsimServer, free_udp_port

RECORDING = Path(__file__).resolve().parents[2] / "fixtures" / "snmp" / "sentry3-fahrenheit.snmprec"


@pytest.fixture(scope="module")
def snmpsim() -> Iterator[SnmpsimServer]:
    server = SnmpsimServer([RECORDING])
    server.start()
    yield server
    server.stop()


class _Silent(asyncio.DatagramProtocol):
    """A UDP port that receives and never answers (what a wrong key looks like)."""


@pytest.fixture
async def silent_port() -> AsyncIterator[int]:
    transport, _ = await asyncio.get_running_loop().create_datagram_endpoint(
        _Silent, local_addr=("127.0.0.1", 0)
    )
    yield transport.get_extra_info("sockname")[1]
    transport.close()


async def _connect_error(adapter: SnmpAdapter) -> Exception:
    try:
        await adapter.connect()
    except Exception as err:  # the test inspects whatever comes out
        return err
    finally:
        await adapter.close()
    raise AssertionError("connect succeeded")


def _v2c(
    port: int, community: bytes = b"sentry3-fahrenheit", host: str = "127.0.0.1"
) -> SnmpAdapter:
    return SnmpAdapter("pdu-a", V2cClient(host, port, community, timeout_s=0.3, retries=0))


async def test_wrong_community_and_dead_port_are_told_apart(snmpsim: SnmpsimServer) -> None:
    wrong = await _connect_error(_v2c(snmpsim.port, b"not-the-community"))
    assert isinstance(wrong, SourceUnavailable)
    text = str(wrong)
    assert text.startswith("pdu-a: ") and "wrong community" in text and "ACL" in text
    assert "port unreachable" not in text

    dead = await _connect_error(_v2c(free_udp_port()))
    assert isinstance(dead, SourceUnavailable)
    assert dead.args[0].startswith("pdu-a: ") and "ICMP port unreachable" in str(dead)
    assert "community" not in str(dead)


async def test_v3_silence_hints_at_user_and_keys(silent_port: int) -> None:
    creds = V3Credentials("rguser", "sha", b"authkey-123", "aes", b"privkey-123")
    client = V3Client("127.0.0.1", silent_port, creds, timeout_s=0.3, retries=0)
    err = await _connect_error(SnmpAdapter("pdu-b", client))
    assert isinstance(err, SourceUnavailable)
    text = str(err)
    assert text.startswith("pdu-b: ") and "privacy key" in text
    assert "'rguser'" in text and "auth_key_file" in text and "priv_key_file" in text


async def test_an_unresolvable_host_is_named_without_pysnmp_internals() -> None:
    err = await _connect_error(_v2c(161, host="pdu-a.invalid"))
    assert isinstance(err, SourceSetupError)
    assert str(err).startswith("pdu-a: host 'pdu-a.invalid' cannot be resolved")
    assert "PySnmp" not in str(err) and "pysnmp" not in str(err)
