"""The power-cap helper over a real Unix socket, with the fake NVML behind it."""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import logging
import math
import os
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from adapters.sensors.power_limit import DirectNvmlLimiter, HelperClient, PowerLimitError
from daemon.cli import main
from daemon.powercap_helper import MAX_REQUEST_BYTES, PowerCapHelper, bound_socket
from fakes.gpus import H100_SXM
from fakes.nvml import FakeNvml, fake_node


@dataclass
class Served:
    fake: FakeNvml
    path: Path
    client: HelperClient


async def _serve(
    tmp_path: Path, allowed_user: str, dynamic_uids: Path | None = None
) -> AsyncIterator[Served]:
    fake = fake_node(H100_SXM, count=2)
    fake.privileged = True
    path = tmp_path / "powercap.sock"
    sock = bound_socket(str(path))
    limiter = DirectNvmlLimiter(fake)
    helper = PowerCapHelper(
        limiter,
        allowed_user=allowed_user,
        idle_exit_s=None,
        dynamic_uids=dynamic_uids or tmp_path / "no-dynamic-uids",
    )
    task = asyncio.create_task(helper.serve(sock))
    try:
        yield Served(fake, path, HelperClient(path, timeout_s=5.0))
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await limiter.close()
        sock.close()


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    async for s in _serve(tmp_path, getpass.getuser()):
        yield s


async def _raw(path: Path, payload: bytes) -> dict[str, Any]:
    reader, writer = await asyncio.open_unix_connection(str(path))
    try:
        writer.write(payload)
        writer.write_eof()
        await writer.drain()
        line = await reader.readline()
    finally:
        writer.close()
    reply = orjson.loads(line)
    assert isinstance(reply, dict)
    return reply


async def test_power_cap_helper_sets_and_logs_the_change(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    uuid = served.fake.gpus[1].uuid
    with caplog.at_level(logging.INFO, logger="daemon.powercap_helper"):
        after = await served.client.set_limit(uuid, 400.0)
    assert (after.uuid, after.requested_w, after.enforced_w) == (uuid, 400.0, 400.0)
    assert served.fake.gpus[1].power_limit_w == 400.0
    change = [r.getMessage() for r in caplog.records if "set GPU" in r.getMessage()]
    assert len(change) == 1
    assert uuid in change[0] and "700 W -> 400 W" in change[0] and "uid " in change[0]


async def test_power_cap_helper_client_sees_another_actors_change(served: Served) -> None:
    await served.client.set_limit(served.fake.gpus[0].uuid, 300.0)
    served.fake.admin_set_limit(0, 650.0)
    gpu0, gpu1 = await served.client.limits()
    assert (gpu0.requested_w, gpu0.enforced_w, gpu0.default_w) == (650.0, 650.0, 700.0)
    assert (gpu1.min_w, gpu1.max_w) == (200.0, 700.0)


async def test_power_cap_helper_client_maps_no_permission_to_permanent(served: Served) -> None:
    served.fake.privileged = False  # the helper not running as root
    with pytest.raises(PowerLimitError, match="NO_PERMISSION") as info:
        await served.client.set_limit(served.fake.gpus[0].uuid, 400.0)
    assert info.value.permanent


async def test_power_cap_helper_client_maps_invalid_argument_to_permanent(
    served: Served,
) -> None:
    served.fake.gpus[0].errors["nvmlDeviceSetPowerManagementLimit"] = (
        served.fake.NVML_ERROR_INVALID_ARGUMENT  # type: ignore[attr-defined]
    )
    with pytest.raises(PowerLimitError, match="INVALID_ARGUMENT") as info:
        await served.client.set_limit(served.fake.gpus[0].uuid, 400.0)
    assert info.value.permanent


async def test_power_cap_helper_refuses_a_peer_of_another_user(tmp_path: Path) -> None:
    assert getpass.getuser() != "nobody"
    async for s in _serve(tmp_path, "nobody"):
        reply = await _raw(s.path, b'{"op":"limits"}\n')
        assert reply["ok"] is False and "may not use this socket" in reply["error"]
        for _ in range(20):  # the refusal may come before the request is written
            with pytest.raises(PowerLimitError, match="may not") as info:
                await s.client.set_limit(s.fake.gpus[0].uuid, 400.0)
            assert info.value.permanent
        assert s.fake.calls["nvmlDeviceSetPowerManagementLimit"] == 0
        assert s.fake.calls["nvmlInit"] == 0  # refused before NVML is touched


@pytest.mark.parametrize(("recorded", "served_ok"), [("rackguard", True), ("intruder", False)])
async def test_power_cap_helper_knows_a_dynamic_user_by_systemds_record(
    tmp_path: Path, recorded: str, served_ok: bool
) -> None:
    """systemd's direct:<uid> -> <name> link names a DynamicUser that no passwd file has."""
    dynamic = tmp_path / "dynamic-uid"
    dynamic.mkdir()
    (dynamic / f"direct:{os.getuid()}").symlink_to(recorded)
    async for s in _serve(tmp_path, "rackguard", dynamic):
        reply = await _raw(s.path, b'{"op":"limits"}\n')
        assert reply["ok"] is served_ok, reply


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        (b'{"op":"set","uuid":"GPU-not-here","watts":400}\n', "no GPU with uuid"),
        (b'{"op":"set","uuid":"%s","watts":NaN}\n', "not JSON"),
        (b'{"op":"set","uuid":"%s","watts":1e999}\n', "not JSON"),
        (b'{"op":"set","uuid":"%s","watts":Infinity}\n', "not JSON"),
        (b'{"op":"set","uuid":"%s","watts":-5}\n', "below its minimum"),
        (b'{"op":"set","uuid":"%s","watts":0}\n', "below its minimum"),
        (b'{"op":"set","uuid":"%s","watts":701}\n', "above its default"),
        (b'{"op":"set","uuid":"%s","watts":"300"}\n', "must be a number"),
        (b'{"op":"set","uuid":"%s","watts":true}\n', "must be a number"),
        (b'{"op":"set","uuid":7,"watts":300}\n', "uuid must be a string"),
        (b'{"op":"set","uuid":"%s"}\n', "takes exactly"),
        (b'{"op":"set","uuid":"%s","watts":300,"index":0}\n', "takes exactly"),
        (b'{"op":"limits","x":1}\n', "takes exactly"),
        (b'{"op":"restore-all"}\n', "unknown op"),
        (b'{"watts":300}\n', "unknown op"),
        (b"[1,2]\n", "JSON object"),
        (b"{not json\n", "not JSON"),
        (b'{"op":"limits"}', "newline-terminated"),
        (b"\n", "not JSON"),
    ],
)
async def test_power_cap_helper_refuses_bad_requests(
    served: Served, payload: bytes, why: str
) -> None:
    if b"%s" in payload:
        payload = payload.replace(b"%s", served.fake.gpus[0].uuid.encode())
    reply = await _raw(served.path, payload)
    assert reply["ok"] is False
    assert why in reply["error"]
    assert reply["permanent"] is True
    assert served.fake.calls["nvmlDeviceSetPowerManagementLimit"] == 0
    assert served.fake.gpus[0].requested_limit_w == 700.0


async def test_power_cap_helper_refuses_an_oversized_line(served: Served) -> None:
    big = b'{"op":"limits","pad":"' + b"x" * MAX_REQUEST_BYTES + b'"}\n'
    reply = await _raw(served.path, big)
    assert reply["ok"] is False and "longer than" in reply["error"]
    # A megabyte: the helper answers after the first kilobyte and hangs up on the rest.
    with contextlib.suppress(ConnectionError):
        reply = await _raw(served.path, big * 1000)
        assert reply["ok"] is False and "longer than" in reply["error"]
    assert (await served.client.limits())[0].requested_w == 700.0  # still serving


async def test_power_cap_helper_drops_a_silent_peer_and_keeps_serving(
    tmp_path: Path,
) -> None:
    async for s in _serve(tmp_path, getpass.getuser()):
        silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        silent.connect(str(s.path))  # says nothing; must not block others
        try:
            assert len(await s.client.limits()) == 2
        finally:
            silent.close()


async def test_power_cap_helper_exits_when_idle(tmp_path: Path) -> None:
    fake = fake_node(H100_SXM, count=1)
    sock = bound_socket(str(tmp_path / "s.sock"))
    limiter = DirectNvmlLimiter(fake)
    helper = PowerCapHelper(limiter, allowed_user=getpass.getuser(), idle_exit_s=0.3)
    try:
        async with asyncio.timeout(5):
            serving = asyncio.create_task(helper.serve(sock))
            await asyncio.sleep(0.1)
            assert len(await HelperClient(tmp_path / "s.sock").limits()) == 1
            await serving  # returns after 0.3 s with no connection
    finally:
        await limiter.close()
        sock.close()


async def test_power_cap_helper_client_unreachable_is_transient(tmp_path: Path) -> None:
    client = HelperClient(tmp_path / "nobody-listens.sock")
    with pytest.raises(PowerLimitError, match="unreachable") as info:
        await client.limits()
    assert not info.value.permanent


async def test_power_cap_helper_client_hung_helper_is_transient(tmp_path: Path) -> None:
    path = tmp_path / "hung.sock"
    sock = bound_socket(str(path))  # listens, never answers
    try:
        with pytest.raises(PowerLimitError, match="no answer") as info:
            await HelperClient(path, timeout_s=0.3).limits()
        assert not info.value.permanent
    finally:
        sock.close()


def test_power_cap_helper_command_refuses_to_start_without_a_socket(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["powercap-helper"], nvml=fake_node(count=1)) == 1
    assert "LISTEN_FDS" in capsys.readouterr().err


async def test_power_cap_helper_hung_nvml_is_a_transient_refusal(tmp_path: Path) -> None:
    fake = fake_node(H100_SXM, count=1)
    fake.privileged = True
    sock = bound_socket(str(tmp_path / "s.sock"))
    limiter = DirectNvmlLimiter(fake)
    helper = PowerCapHelper(
        limiter, allowed_user=getpass.getuser(), idle_exit_s=None, nvml_timeout_s=0.2
    )
    serving = asyncio.create_task(helper.serve(sock))
    client = HelperClient(tmp_path / "s.sock", timeout_s=5.0)
    try:
        assert len(await client.limits()) == 1
        fake.gpus[0].delay_s = 1.0  # the driver hangs
        for _ in range(2):  # the second finds NVML's thread still busy: no queueing
            with pytest.raises(PowerLimitError) as info:
                await client.set_limit(fake.gpus[0].uuid, 300.0)
            assert not info.value.permanent
        fake.gpus[0].delay_s = 0.0
        await asyncio.sleep(1.2)  # the abandoned call returns
        after = await client.set_limit(fake.gpus[0].uuid, 300.0)
        assert after.requested_w == 300.0
    finally:
        serving.cancel()
        with pytest.raises(asyncio.CancelledError):
            await serving
        await limiter.close()
        sock.close()


@pytest.mark.parametrize("bad", ["nan", "inf", "-1", "soon"])
def test_power_cap_helper_command_refuses_a_bad_idle_time(
    bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["powercap-helper", "--idle-exit-s", bad], nvml=fake_node(count=1))
    assert exit_info.value.code == 2
    assert f"--idle-exit-s: not a number of seconds >= 0: {bad!r}" in capsys.readouterr().err


@pytest.mark.parametrize("watts", [math.nan, math.inf, -math.inf])
async def test_power_cap_helper_client_refuses_non_finite_watts_itself(
    served: Served, watts: float
) -> None:
    with pytest.raises(PowerLimitError, match="finite") as info:
        await served.client.set_limit(served.fake.gpus[0].uuid, watts)
    assert info.value.permanent
    assert served.fake.calls["nvmlDeviceSetPowerManagementLimit"] == 0
