"""The Slurm sink's REST write path (Slurm >= 23.02) against the fake slurmrestd, the
fake against the recorded real exchanges, JWT handling and the [scheduler] config."""

from __future__ import annotations

import base64
import re
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import ClientSession

from adapters.base import DeliveryError
from adapters.schedulers.base import NodeReadError, NodeView
from adapters.schedulers.slurm.auth import JwtToken, parse_token_output, token_expiry
from adapters.schedulers.slurm.client import SlurmClient
from adapters.schedulers.slurm.listing import listed_scontrol
from adapters.schedulers.slurm.sink import SlurmSink, parse_scontrol_node
from adapters.schedulers.slurm.versions import api_info, node_view
from daemon.config import ConfigError, parse_config
from daemon.config.scheduler import SlurmSchedulerConfig
from fakes.slurmrestd import FakeSlurmrestd, expand_hostlist
from policies.model import REASON_PREFIX, Action, Decision, FaultDomain, idempotency_key
from tests.support.paths import SHARED_DATA
from tests.support.secrets import write_secret

TRANSCRIPT_24_11 = SHARED_DATA / "slurm" / "slurmrestd-24.11-transcript.txt"


def decision(node: str, action: Action, epoch: int = 1) -> Decision:
    return Decision(
        node,
        action,
        f"{REASON_PREFIX} rest {action}",
        FaultDomain.GPU,
        0.0,
        idempotency_key(node, action, epoch),
    )


def jwt(exp: float) -> str:
    def part(data: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(orjson.dumps(data)).decode().rstrip("=")

    return f"{part({'alg': 'HS256'})}.{part({'exp': int(exp), 'sun': 'root'})}.sig"


async def test_drain_down_resume_through_rest(fake: FakeSlurmrestd, slurm_token: Path) -> None:
    sink = SlurmSink(SlurmClient(fake.url, token=JwtToken(slurm_token)), exclude_state="down")
    try:
        await sink.deliver(decision("gpu01", Action.DRAIN))
        drained = (await sink.read_state(["gpu01"]))["gpu01"]
        await sink.deliver(decision("gpu02", Action.EXCLUDE))
        await sink.deliver(decision("gpu01", Action.RESUME))
        views = await sink.read_state(["gpu01", "gpu02", "gpu03"])
    finally:
        await sink.close()
    assert drained.drained and drained.ours and drained.detail == "IDLE+DRAIN"
    assert views["gpu02"].down and views["gpu02"].reason == "rackguard[gpu]: exclude: rest exclude"
    assert not views["gpu01"].held and not views["gpu03"].held
    # The newest version served, and the bulk GET for more than one node.
    assert ("POST", "/slurm/v0.0.42/node/gpu01") in fake.requests
    assert ("GET", "/slurm/v0.0.42/nodes") in fake.requests
    assert [(w.node, w.state) for w in fake.writes] == [
        ("gpu01", "DRAIN"),
        ("gpu02", "DOWN"),
        ("gpu01", "RESUME"),
    ]


async def test_a_configured_version_is_used(fake: FakeSlurmrestd, slurm_token: Path) -> None:
    sink = SlurmSink(SlurmClient(fake.url, token=JwtToken(slurm_token), api_version="v0.0.40"))
    try:
        await sink.deliver(decision("gpu01", Action.DRAIN))
        with pytest.raises(DeliveryError, match=r"does not serve v0\.0\.39"):
            await SlurmSink(
                SlurmClient(fake.url, token=JwtToken(slurm_token), api_version="v0.0.39")
            ).deliver(decision("gpu01", Action.DRAIN))
    finally:
        await sink.close()
    assert ("POST", "/slurm/v0.0.40/node/gpu01") in fake.requests


@pytest.mark.parametrize(
    ("node", "action", "admin", "error"),
    [
        ("gpu99", Action.DRAIN, True, "Slurm error 2018"),
        ("gpu01", Action.RESUME, True, "Slurm error 2028"),  # resume of a node in service
        ("gpu01", Action.DRAIN, False, "Slurm error 2010"),
    ],
)
async def test_slurm_errors_are_clear_and_permanent(
    fake: FakeSlurmrestd, slurm_token: Path, node: str, action: Action, admin: bool, error: str
) -> None:
    if not admin:
        fake.admins = set()
    sink = SlurmSink(SlurmClient(fake.url, token=JwtToken(slurm_token)))
    try:
        with pytest.raises(DeliveryError) as info:
            await sink.deliver(decision(node, action))
    finally:
        await sink.close()
    assert info.value.permanent and error in str(info.value)
    assert fake.writes == []


async def test_server_errors_and_refused_connections_are_transient(
    fake: FakeSlurmrestd, slurm_token: Path
) -> None:
    fake.fail_next, fake.fail_status = 1, 502
    sink = SlurmSink(SlurmClient(fake.url, token=JwtToken(slurm_token)))
    dead = SlurmSink(SlurmClient("http://127.0.0.1:9", token=JwtToken(slurm_token), timeout_s=1.0))
    try:
        with pytest.raises(DeliveryError) as info:
            await sink.deliver(decision("gpu01", Action.DRAIN))
        assert not info.value.permanent and "HTTP 502" in str(info.value)
        with pytest.raises(DeliveryError) as info2:
            await dead.deliver(decision("gpu01", Action.DRAIN))
        assert not info2.value.permanent
    finally:
        await sink.close()
        await dead.close()


async def test_a_404_without_slurm_error_2018_is_transient_and_redetects_the_version(
    fake: FakeSlurmrestd, slurm_token: Path
) -> None:
    sink = SlurmSink(SlurmClient(fake.url, token=JwtToken(slurm_token)))
    try:
        assert (await sink.read_state(["gpu01"]))["gpu01"].exists
        fake.fail_next, fake.fail_status, fake.fail_body = 1, 404, {"errors": []}
        with pytest.raises(NodeReadError) as info:  # e.g. a proxy, or a dropped API version
            await sink.read_state(["gpu01"])
        assert not info.value.permanent and "2018" in str(info.value)
        before = len(fake.requests)
        assert (await sink.read_state(["gpu01"]))["gpu01"].exists
        assert any(p.startswith("/openapi") for _, p in fake.requests[before:])  # re-detected
    finally:
        await sink.close()


async def test_rest_writes_on_a_22_05_server_are_refused_clearly(slurm_token: Path) -> None:
    old = FakeSlurmrestd(versions=("v0.0.36", "v0.0.37", "v0.0.38"))
    await old.start()
    sink = SlurmSink(SlurmClient(old.url, token=JwtToken(slurm_token), write_via="rest"))
    try:
        with pytest.raises(DeliveryError) as info:
            await sink.deliver(decision("gpu01", Action.DRAIN))
        view = (await sink.read_state(["gpu01"]))["gpu01"]  # v0.0.38 node shape
    finally:
        await sink.close()
        await old.stop()
    assert info.value.permanent and "write_via = 'scontrol'" in str(info.value)
    assert view.exists and not view.held and view.detail == "IDLE"


async def test_511_refreshes_the_token_with_the_command(
    fake: FakeSlurmrestd, tmp_path: Path
) -> None:
    stale = tmp_path / "jwt"
    write_secret(stale, "SLURM_JWT=expired\n")
    fake.tokens["root"] = "fresh"
    command = [sys.executable, "-c", "print('SLURM_JWT=fresh')"]
    token = JwtToken(stale, refresh_command=command)
    sink = SlurmSink(SlurmClient(fake.url, token=token))
    try:
        await sink.deliver(decision("gpu01", Action.DRAIN))
    finally:
        await sink.close()
    assert token.refreshes == 1 and fake.auth_failures == 1
    assert fake.nodes["gpu01"].flags == ["DRAIN"]


async def test_a_token_about_to_expire_is_refreshed_first(
    fake: FakeSlurmrestd, tmp_path: Path
) -> None:
    soon, later = jwt(time.time() + 30), jwt(time.time() + 3600)
    path = tmp_path / "jwt"
    write_secret(path, soon)
    fake.tokens["root"] = later
    # This command rewrites the file and prints nothing: the file is read again.
    command = [sys.executable, "-c", f"open({str(path)!r}, 'w').write({later!r})"]
    token = JwtToken(path, refresh_command=command, refresh_before_s=300)
    sink = SlurmSink(SlurmClient(fake.url, token=token, auth="bearer"))
    try:
        await sink.read_state(["gpu01"])
    finally:
        await sink.close()
    assert token.refreshes == 1 and fake.auth_failures == 0


async def test_a_refused_token_without_a_command_is_retried_as_an_auth_refusal(
    fake: FakeSlurmrestd, tmp_path: Path
) -> None:
    path = tmp_path / "jwt"
    write_secret(path, "wrong")
    sink = SlurmSink(SlurmClient(fake.url, token=JwtToken(path)))
    try:
        with pytest.raises(DeliveryError) as info:
            await sink.deliver(decision("gpu01", Action.DRAIN))
    finally:
        await sink.close()
    # The operator must fix the token: retried slowly and reported, never dropped.
    assert info.value.reason == "auth" and not info.value.final and "HTTP 511" in str(info.value)


def test_token_helpers() -> None:
    assert token_expiry(jwt(1234567890)) == 1234567890.0
    assert token_expiry("not-a-jwt") is None
    assert parse_token_output("SLURM_JWT=abc\n") == "abc"
    assert parse_token_output("\n  xyz \n") == "xyz"


def test_scontrol_show_node_parses() -> None:
    line = (
        "NodeName=gpu01 Arch=x86_64 CoresPerSocket=1 State=IDLE+DRAIN ThreadsPerCore=1 "
        "Partitions=gpu Reason=rackguard: GPU 3 hot [root@2026-11-30T05:08:24]"
    )
    view = parse_scontrol_node(line)
    assert view is not None
    assert view.drained and not view.down and view.reason == "rackguard: GPU 3 hot"
    assert parse_scontrol_node("Node gpu99 not found") is None


# A 22.05 line as scontrol printed it here: Comment= and Extra= follow Reason=, and an
# admin's comment may hold anything, "Reason=" and brackets included.
LINE_22_05 = (
    "NodeName=gpu01 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 State=IDLE+DRAIN "
    "OS=Linux 6.18.44 #1 SMP PREEMPT_DYNAMIC @0  ActiveFeatures=rack_a Weight=1 "
    "Reason=maint ticket-1 [root@2026-12-05T00:12:03] "
    "Comment=hello Reason=x [a@2026-01-01T00:00:00] world Extra=ex1"
)


@pytest.mark.parametrize(
    ("tail", "reason", "at"),
    [
        ("Reason=maint ticket-1 [root@2026-12-05T00:12:03]", "maint ticket-1", True),
        (
            "Reason=maint ticket-1 [root@2026-12-05T00:12:03] Comment=c [x] Extra=e",
            "maint ticket-1",
            True,
        ),
        ("Reason=a [b] c [slurm@2026-12-05T00:12:03] Extra={}", "a [b] c", True),
        ("Reason=no stamp here Comment=c", "no stamp here", False),
        ("Reason=plain", "plain", False),
    ],
)
def test_the_reason_stops_at_the_next_key(tail: str, reason: str, at: bool) -> None:
    line = f"NodeName=gpu01 State=IDLE+DRAIN {tail}"
    view = parse_scontrol_node(line)
    listed = listed_scontrol(line, view or NodeView(""))
    assert view is not None and view.reason == reason
    assert (listed.reason_at is not None) is at


def test_a_22_05_line_with_comment_and_extra() -> None:
    view = parse_scontrol_node(LINE_22_05)
    listed = listed_scontrol(LINE_22_05, view or NodeView(""))
    assert view is not None and view.drained and view.reason == "maint ticket-1"
    assert listed.rack == "a" and listed.reason_at is not None


def test_api_info_finds_versions_and_node_writes() -> None:
    spec: dict[str, Any] = {
        "paths": {
            "/slurm/v0.0.38/node/{node_name}": {"get": {}},
            "/slurm/v0.0.40/node/{node_name}": {"get": {}, "post": {}},
            "/slurm/v0.0.41/nodes": {"get": {}},
            "/slurmdb/v0.0.41/jobs": {"get": {}},
            "/openapi/v3": {"get": {}},
        }
    }
    info = api_info(spec)
    assert info.versions == ("v0.0.38", "v0.0.40", "v0.0.41")
    assert info.pick() == "v0.0.41" and not info.can_write("v0.0.41")
    assert info.can_write("v0.0.40") and not info.can_write("v0.0.38")


def test_hostlists_expand() -> None:
    assert expand_hostlist("gpu[02-03,05]") == ["gpu02", "gpu03", "gpu05"]
    assert expand_hostlist("a,b") == ["a", "b"]


def _transcript_calls(text: str) -> list[tuple[str, dict[str, object], int, list[int]]]:
    """(path, body, status, error numbers) of each recorded curl POST."""
    calls = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"\$ curl -X POST .*-d '(\{.*\})' \$SLURM_REST_URL(\S+)", line)
        if not m:
            continue
        answer = re.match(r"HTTP (\d+) (\{.*\})", lines[i + 1])
        assert answer, lines[i + 1]
        body = orjson.loads(answer.group(2))
        numbers = [e["error_number"] for e in body["errors"]]
        calls.append((m.group(2), orjson.loads(m.group(1)), int(answer.group(1)), numbers))
    return calls


async def test_fake_reproduces_the_recorded_24_11_exchanges() -> None:
    if not TRANSCRIPT_24_11.is_file():
        pytest.skip(f"real-world data not available: {TRANSCRIPT_24_11} (../shared/data)")
    text = TRANSCRIPT_24_11.read_text()
    calls = _transcript_calls(text)
    assert len(calls) >= 10
    fake = FakeSlurmrestd()
    await fake.start()
    headers = {"X-SLURM-USER-NAME": "root", "X-SLURM-USER-TOKEN": "token-root"}
    got = []
    try:
        async with ClientSession() as http:
            for path, body, _, _ in calls:
                async with http.post(fake.url + path, json=body, headers=headers) as resp:
                    answer = await resp.json()
                    got.append((resp.status, [e["error_number"] for e in answer["errors"]]))
            async with http.post(fake.url + "/slurm/v0.0.42/node/gpu04", json={}) as resp:
                no_token = resp.status
            bad = {**headers, "X-SLURM-USER-TOKEN": "bad"}
            async with http.post(fake.url + "/slurm/v0.0.42/node/gpu04", json={}, headers=bad) as r:
                bad_token = r.status
    finally:
        await fake.stop()
    assert got == [(status, numbers) for _, _, status, numbers in calls]
    assert (no_token, bad_token) == (401, 511)
    # The node objects recorded parse to the states they show.
    for line in text.splitlines():
        if line.startswith('{"name":'):
            node = orjson.loads(line)
            view = node_view(node)
            assert view.drained == ("DRAIN" in node["state"])
            assert view.down == ("DOWN" in node["state"])


def test_slurm_config_loads_and_names_problems(tmp_path: Path) -> None:
    token = tmp_path / "jwt"
    write_secret(token, "t")
    text = f"""
[node]
name = "gpu01"
[sources.gpus]
type = "nvml"
[scheduler]
type = "slurm"
rest_url = "http://127.0.0.1:6820"
token_file = "{token}"
token_refresh_command = ["scontrol", "token", "lifespan=3600"]
outbox_path = "{tmp_path / "outbox.sqlite3"}"
reconcile_interval_s = 30.0
"""
    cfg = parse_config(text).scheduler
    assert isinstance(cfg, SlurmSchedulerConfig)
    assert cfg.token_refresh_command == ("scontrol", "token", "lifespan=3600")
    assert cfg.write_via == "auto" and cfg.outbox_path == tmp_path / "outbox.sqlite3"
    bad = text.replace('rest_url = "http://127.0.0.1:6820"', 'rest_url = "ftp://x"')
    bad = bad.replace(f'token_file = "{token}"', "").replace("reconcile_interval_s = 30.0", "")
    bad = bad.replace(str(tmp_path / "outbox.sqlite3"), str(tmp_path))
    with pytest.raises(ConfigError) as info:
        parse_config(bad + 'api_version = "0.0.40"\n')
    problems = "\n".join(info.value.problems)
    assert "scheduler.rest_url: must be an http" in problems
    assert "scheduler.token_file: required with rest_url" in problems
    assert f"scheduler.outbox_path: '{tmp_path}' is a directory" in problems
    assert "scheduler.api_version: must look like 'v0.0.40'" in problems
