"""The serve harness in-process, read by the real adapters: SNMPv3, the MIB layouts, faults."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import orjson
import pynvml
import pytest

from adapters.base import SensorAdapter
from adapters.errors import SourceError
from adapters.sensors.nvml import NvmlAdapter
from daemon.config import parse_config
from daemon.service.sources import build_adapter
from fakes.cdu_server import nodesets_available
from fakes.demo import playable_speed
from fakes.gpus import H100_SXM, make_gpus
from fakes.nvml import fake_node
from fakes.sim import load_scenario
from fakes.sim.cli import score
from fakes.sim.control import start_control
from fakes.sim.decision_logs import read_file
from fakes.sim.faults import FAULTS, FaultError
from fakes.sim.harness import Harness, ServeOptions
from fakes.sim.load import poll_timeout_note
from fakes.sim.served_gpus import (
    STALE_AFTER_S,
    ServedNvml,
    encode_node,
    node_file,
    write_atomic,
)
from fakes.sim.snmp_engine_agent import V3User
from policies.model import Quality, Reading, SensorKind
from tests.support.daemon_harness import config_text, running
from tests.support.paths import SHARED_DATA
from tests.support.secrets import write_secret
from tests.support.wait import wait_for_result, wait_until

AUTH_KEY = "staging-auth-key"
PRIV_KEY = "staging-priv-key"


def _scenario(tmp_path: Path) -> Path:
    path = tmp_path / "two-nodes.toml"
    path.write_text(
        """
name = "two-nodes"
description = "Two nodes at work."
duration_s = 600
[rack]
nodes = ["a-01", "a-02"]
gpus_per_node = 2
[[events]]
at_s = 0
kind = "job_start"
target = "rack"
[expect]
"""
    )
    return path


@pytest.fixture
async def harness(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    profile = getattr(request, "param", "apc-rpdu2")
    h = Harness(
        load_scenario(str(_scenario(tmp_path))),
        ServeOptions(
            state_dir=tmp_path / "sim",
            speed=1.0,
            pdu_port=0,
            pdu_profile=profile,
            v3_users=(V3User("staging", AUTH_KEY, PRIV_KEY),),
            cdu_port=0,
        ),
    )
    await h.start()
    try:
        yield h
    finally:
        await h.stop()


def _pdu_source(tmp_path: Path, h: Harness, *, v3: bool, auth_key: str = AUTH_KEY) -> SensorAdapter:
    write_secret(tmp_path / "auth", auth_key)
    write_secret(tmp_path / "priv", PRIV_KEY)
    write_secret(tmp_path / "community", "public")
    ep = h.endpoints()["pdu"]
    probes = ", ".join(f'"{k}" = "{v}"' for k, v in ep["probe_positions"].items())
    auth = (
        f'version = "3"\nuser = "staging"\nauth_key_file = "{tmp_path / "auth"}"\n'
        f'priv_key_file = "{tmp_path / "priv"}"'
        if v3
        else f'community_file = "{tmp_path / "community"}"'
    )
    cfg = parse_config(
        f"""
[node]
name = "a-01"
rack = "r"
[sources.pdu]
type = "snmp"
host = "127.0.0.1"
port = {ep["port"]}
profile = "{ep["profile"]}"
probe_positions = {{ {probes} }}
retries = 0
{auth}
[scheduler]
type = "webhook"
url = "http://127.0.0.1:9/x"
secret_file = "{tmp_path / "auth"}"
""",
        origin="test",
    )
    return build_adapter("pdu", cfg.sources["pdu"])


def _inlets(readings: list[Reading] | tuple[Reading, ...]) -> dict[str, Reading]:
    return {
        r.labels.get("position", r.sensor): r
        for r in readings
        if r.kind is SensorKind.INLET_TEMPERATURE
    }


@pytest.mark.parametrize("harness", ["apc-rpdu2", "raritan-px2", "sentry4"], indirect=True)
async def test_each_vendor_layout_reads_through_its_shipped_profile_over_v3(
    tmp_path: Path, harness: Harness
) -> None:
    pdu = _pdu_source(tmp_path, harness, v3=True)
    await pdu.connect()
    try:
        inlets = _inlets(list(await pdu.read()))
    finally:
        await pdu.close()
    truth = harness.rack.snapshot.inlet_c
    got = {
        label: r
        for label in truth
        for name, r in inlets.items()
        if label in name or r.labels.get("position") == label
    }
    assert set(got) == set(truth), inlets
    for label, r in got.items():
        assert r.quality is Quality.GOOD
        assert r.value == pytest.approx(truth[label], abs=0.06)  # one decimal on the wire


async def test_pdu_faults_wrong_keys_garbage_and_silence(tmp_path: Path, harness: Harness) -> None:
    wrong = _pdu_source(tmp_path, harness, v3=True, auth_key="not-the-auth-key")
    try:
        with pytest.raises(SourceError, match="WrongDigest"):
            await wrong.connect()
            await wrong.read()
    finally:
        await wrong.close()

    pdu = _pdu_source(tmp_path, harness, v3=False)
    await pdu.connect()
    try:
        harness.apply("pdu_garbage", {})
        bad = _inlets(list(await pdu.read()))
        assert bad and all(r.quality is Quality.BAD and r.reason for r in bad.values())
        harness.apply("pdu_ok", {})
        good = _inlets(list(await pdu.read()))
        assert good and all(r.quality is Quality.GOOD for r in good.values())
        harness.apply("pdu_silent", {})
        before = harness.pdu.requests
        with pytest.raises(SourceError, match="no answer"):
            await pdu.read()
        assert harness.pdu.requests > before  # it was asked, and said nothing
        harness.apply("pdu_slow", {"delay_s": 5.0})  # later than the source's request timeout
        with pytest.raises(SourceError, match="no answer"):
            await pdu.read()
        harness.apply("pdu_slow", {"delay_s": 0.05})  # late, but in time
        assert _inlets(list(await pdu.read()))
    finally:
        await pdu.close()


def _gpu_adapter(h: Harness, node: str) -> NvmlAdapter:
    return NvmlAdapter("gpus", ServedNvml(node_file(h.options.state_dir, node)))


def _temps(readings: list[Reading] | tuple[Reading, ...]) -> dict[str, Reading]:
    return {r.sensor: r for r in readings if r.kind is SensorKind.GPU_TEMPERATURE}


async def test_served_gpus_follow_the_simulator_and_take_gpu_faults(harness: Harness) -> None:
    gpus = _gpu_adapter(harness, "a-02")
    await gpus.connect()
    try:
        temps = _temps(list(await gpus.read()))
        truth = harness.rack.snapshot.node("a-02").gpus
        assert set(temps) == {"gpu0.temperature", "gpu1.temperature"}
        assert temps["gpu1.temperature"].value == round(truth[1].temperature_c)

        harness.apply("sensor_stick", {"node": "a-02", "gpu": 0})
        stuck = harness.stuck[("a-02", 0)]
        harness.rack.advance(120.0)  # the GPU moves on; its sensor does not
        harness._publish_gpus()
        assert harness.rack.snapshot.node("a-02").gpus[0].temperature_c != stuck
        temps = _temps(list(await gpus.read()))
        assert temps["gpu0.temperature"].value == round(stuck)

        harness.apply("sensor_drop", {"target": "a-02", "gpu": 1, "duration_s": 30})
        temps = _temps(list(await gpus.read()))
        assert temps["gpu1.temperature"].quality is Quality.BAD
        assert "NVML_ERROR_UNKNOWN" in temps["gpu1.temperature"].reason

        harness.apply("gpu_lost", {"node": "a-02", "gpu": 1})
        readings = list(await gpus.read())
        lost = [r for r in readings if r.labels.get("gpu") == "1"]
        assert lost and all(r.quality is Quality.BAD for r in lost)
        assert any("GPU_IS_LOST" in r.reason for r in lost)
    finally:
        await gpus.close()
    # The other node's GPUs are untouched.
    other = ServedNvml(node_file(harness.options.state_dir, "a-01"))
    other.nvmlInit()
    assert not any(g.lost for g in other.gpus)


def test_a_missing_node_file_fails_every_call_rather_than_inventing_gpus(tmp_path: Path) -> None:
    nvml = ServedNvml(tmp_path / "nope.json")
    with pytest.raises(pynvml.NVMLError) as err:
        nvml.nvmlInit()
    assert err.value.value == pynvml.NVML_ERROR_UNKNOWN
    assert "nope.json" in nvml.problem
    (tmp_path / "garbage.json").write_text("{not json")
    bad = ServedNvml(tmp_path / "garbage.json")
    with pytest.raises(pynvml.NVMLError):
        bad.nvmlInit()
    assert "unreadable" in bad.problem


async def test_simulator_faults_change_the_rack_and_are_recorded(harness: Harness) -> None:
    harness.apply("pump_fail", {"residual_flow_pct": 3})
    harness.rack.advance(30.0)
    assert not harness.rack.snapshot.cdu.pump_running
    assert harness.rack.snapshot.cdu.flow_lpm < 10
    harness.apply("inlet_ramp", {"rate_c_per_min": 2.0})
    record = harness.run_record()
    assert [f["fault"] for f in record["faults"]] == ["pump_fail", "inlet_ramp"]
    assert record["faults"][0]["params"] == {"residual_flow_pct": 3.0}
    on_disk = (harness.options.state_dir / "run.json").read_text()
    assert '"inlet_ramp"' in on_disk


BAD_REQUESTS: list[tuple[str, dict[str, object], str]] = [
    ("pump_explode", {}, "unknown fault 'pump_explode' (known: pump_fail, pump_restore"),
    ("pump_fail", {"residual_flow_pct": 300}, "residual_flow_pct: must be from 0 to 100"),
    ("pump_fail", {"residual": 3}, "pump_fail: residual: unknown parameter"),
    ("sensor_stick", {"node": "a-01"}, "sensor_stick: gpu: required parameter is missing"),
    ("sensor_stick", {"node": "zz", "gpu": 0}, "node: unknown node 'zz' (nodes: a-01, a-02)"),
    ("sensor_drop", {"target": "a-01", "gpu": 7}, "gpu: must be below gpus_per_node (2)"),
    ("pdu_slow", {"delay_s": "soon"}, "pdu_slow: delay_s: must be a number"),
]


async def test_bad_fault_requests_name_the_key_and_change_nothing(harness: Harness) -> None:
    for name, params, message in BAD_REQUESTS:
        with pytest.raises(FaultError) as err:
            harness.apply(name, params)
        assert message in str(err.value), name
    assert harness.history == []
    assert harness.pdu.mode == "ok"


async def test_control_api_applies_lists_and_refuses(harness: Harness) -> None:
    runner = await start_control(harness, "127.0.0.1", 0)
    port = runner.addresses[0][1]
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base}/v1/faults") as rsp:
                listed = await rsp.json()
            assert {f["name"] for f in listed["faults"]} == set(FAULTS)
            async with http.post(f"{base}/v1/faults/cdu_restart", json={"downtime_s": 0}) as rsp:
                assert rsp.status == 200
            old = harness.cdu.node_id("flow")
            await wait_until(
                lambda: harness.cdu.node_id("flow") != old and harness.cdu.publishes > 0,
                timeout=30,
                what="the CDU back with new NodeIds",
            )
            as_json = {"Content-Type": "application/json"}
            async with http.post(f"{base}/v1/faults/nope", data=b"", headers=as_json) as rsp:
                assert rsp.status == 400
                assert "known: pump_fail" in (await rsp.json())["error"]
            async with http.post(
                f"{base}/v1/faults/pump_fail", data=b"[1]", headers=as_json
            ) as rsp:
                assert rsp.status == 400
                assert "JSON object" in (await rsp.json())["error"]
            async with http.get(f"{base}/v1/status") as rsp:
                status = await rsp.json()
            assert [f["fault"] for f in status["faults"]] == ["cdu_restart"]
            assert status["rack"]["pump_running"] is True
    finally:
        await runner.cleanup()


async def test_control_api_refuses_what_a_web_page_could_send(harness: Harness) -> None:
    runner = await start_control(harness, "127.0.0.1", 0)
    port = runner.addresses[0][1]
    url = f"http://127.0.0.1:{port}/v1/faults/pump_fail"
    own = {"Content-Type": "application/json", "Origin": f"http://127.0.0.1:{port}"}
    refused = [
        # A cross-origin "simple request": no preflight, so the browser sends it.
        ({"Content-Type": "text/plain", "Origin": "http://evil.example"}, b"{}", 403),
        ({"Content-Type": "application/json", "Origin": "http://evil.example"}, b"{}", 403),
        ({"Content-Type": "application/json", "Origin": "null"}, b"{}", 403),
        ({"Content-Type": "application/json", "Sec-Fetch-Site": "cross-site"}, b"{}", 403),
        ({"Content-Type": "text/plain"}, b"{}", 415),
        ({"Content-Type": "application/x-www-form-urlencoded"}, b"a=1", 415),
        ({"Content-Type": "application/json", "Host": "evil.example"}, b"{}", 403),  # rebinding
        ({"Content-Type": "application/json"}, b'{"residual_flow_pct": 1e308}', 400),
        ({"Content-Type": "application/json"}, b'{"residual_flow_pct": -5}', 400),
    ]
    try:
        async with aiohttp.ClientSession() as http:
            for headers, body, status in refused:
                async with http.post(url, data=body, headers=headers) as rsp:
                    assert rsp.status == status, (headers, body)
            bounded = f"http://127.0.0.1:{port}/v1/faults/cdu_restart"
            async with http.post(bounded, data=b'{"downtime_s": -5}', headers=own) as rsp:
                assert rsp.status == 400 and "from 0 to 600" in (await rsp.json())["error"]
            assert harness.history == []  # nothing applied
            async with http.post(url, data=b"{}", headers=own) as rsp:
                assert rsp.status == 200  # its own page, or a program: applied
    finally:
        await runner.cleanup()
    assert [h["fault"] for h in harness.history] == ["pump_fail"]


def test_every_number_a_fault_takes_is_bounded() -> None:
    for spec in FAULTS.values():
        numbers = {k for k, v in spec.params.items() if isinstance(v, float)}
        assert numbers == set(spec.bounds), spec.name


async def test_control_api_refuses_a_non_loopback_address(harness: Harness) -> None:
    with pytest.raises(ValueError, match="not a loopback address"):
        await start_control(harness, "0.0.0.0", 0)


def test_a_node_file_no_longer_rewritten_is_unknown_not_frozen(tmp_path: Path) -> None:
    path = tmp_path / "n.json"
    gpus = make_gpus(H100_SXM, 1)
    write_atomic(path, encode_node("n", "h100-sxm", gpus))
    nvml = ServedNvml(path)
    nvml.nvmlInit()
    assert nvml.nvmlDeviceGetCount() == 1
    old = orjson.loads(path.read_bytes())
    old["written_at"] -= STALE_AFTER_S + 1  # serve stopped writing a while ago
    write_atomic(path, orjson.dumps(old))
    with pytest.raises(pynvml.NVMLError):
        nvml.nvmlDeviceGetCount()
    assert "not rewritten for" in nvml.problem


async def test_a_full_disk_stops_the_gpu_files_not_the_rack(harness: Harness) -> None:
    gpus_dir = harness.options.state_dir / "gpus"
    for f in gpus_dir.iterdir():
        f.unlink()
    gpus_dir.rmdir()
    gpus_dir.write_text("a file where the folder was: every write fails")
    harness._publish_gpus_logged()  # logs once, raises nothing
    harness.rack.advance(5.0)
    harness._publish_gpus_logged()
    assert harness._publish_failing
    gpus_dir.unlink()
    gpus_dir.mkdir()
    harness._publish_gpus_logged()
    assert not harness._publish_failing
    assert node_file(harness.options.state_dir, "a-01").exists()


@pytest.mark.skipif(
    not nodesets_available(SHARED_DATA / "opcua"),
    reason="the OPC 40082-1 nodesets are not in ../shared/data/opcua: the TCD model is skipped",
)
async def test_tcd_cdu_serves_the_pump_failure_to_the_tcd_profile(tmp_path: Path) -> None:
    h = Harness(
        load_scenario(str(_scenario(tmp_path))),
        ServeOptions(
            state_dir=tmp_path / "sim",
            pdu_port=0,
            cdu_port=0,
            cdu_model="tcd",
            nodeset_dir=SHARED_DATA / "opcua",
        ),
    )
    await h.start()
    write_secret(tmp_path / "key", "k")
    cfg = parse_config(
        f"""
[node]
name = "a-01"
rack = "r"
[sources.cdu]
type = "opcua"
url = "{h.endpoints()["cdu"]["url"]}"
profile = "{h.endpoints()["cdu"]["profile"]}"
[scheduler]
type = "webhook"
url = "http://127.0.0.1:9/x"
secret_file = "{tmp_path / "key"}"
""",
        origin="test",
    )
    cdu = build_adapter("cdu", cfg.sources["cdu"])
    try:
        await cdu.connect()
        flow = {r.sensor: r for r in await cdu.read()}["cdu.flow"]
        assert flow.value == pytest.approx(h.rack.snapshot.cdu.flow_lpm, abs=0.01)
        h.apply("pump_fail", {})
        h.rack.advance(30.0)
        await h.cdu.publish(h.rack.snapshot.cdu)

        async def read() -> dict[str, Reading]:
            return {r.sensor: r for r in await cdu.read()}

        def pump_stopped(r: dict[str, Reading]) -> bool:
            return r["cdu.pump_state"].value == 0  # delivered by the subscription

        readings = await wait_for_result(read, pump_stopped, timeout=30, what="pump stopped")
        after = readings["cdu.flow"].value
        assert after is not None and after < 10
    finally:
        await cdu.close()
        await h.stop()


async def test_stopping_the_staging_scheduler_makes_readyz_degraded_and_the_score_fail(
    tmp_path: Path,
) -> None:
    scenario_file = tmp_path / "one-node.toml"
    scenario_file.write_text(
        """
name = "one-node"
description = "The daemon's node, drained while the scheduler is down."
duration_s = 600
[rack]
nodes = ["gpu-node-07"]
gpus_per_node = 2
[expect]
drained_nodes = ["gpu-node-07"]
"""
    )
    scenario = load_scenario(str(scenario_file))
    key = tmp_path / "webhook.key"
    write_secret(key, "staging-webhook-key\n")  # the newline is stripped on both sides
    h = Harness(
        scenario,
        ServeOptions(
            state_dir=tmp_path / "sim",
            pdu_port=0,
            cdu_port=0,
            scheduler_host="127.0.0.1",
            webhook_secret=b"staging-webhook-key",
        ),
    )
    await h.start()
    nvml = fake_node()
    for g in nvml.gpus:
        g.temperature_c = 50.0
    assert h.scheduler is not None
    text = config_text(h.scheduler.url, key, scheduler_extra="undeliverable_after_s = 0.5")
    try:
        async with running(text, nvml) as daemon, aiohttp.ClientSession() as http:
            base = f"http://127.0.0.1:{daemon.api_port}"

            async def logged() -> list[tuple[float, str, str]]:
                async with http.get(f"{base}/v1/decisions") as resp:
                    (tmp_path / "log.json").write_bytes(await resp.read())
                return read_file(tmp_path / "log.json")

            async def problems() -> list[str]:
                async with http.get(f"{base}/readyz") as resp:
                    body = await resp.json()
                    assert (resp.status == 200) == body["ready"]
                    return list(body["problems"])

            assert await problems() == []
            h.apply("scheduler_down", {})
            await wait_until(lambda: not h.scheduler_up, what="the scheduler stopping")
            nvml.gpus[1].temperature_c = 86.0
            await wait_until(lambda: daemon.engine.state.action.value == "drain", what="drain")
            found = await wait_for_result(problems, bool, what="/readyz naming the drain")
            assert "gpu-node-07 drain (decision #1) undeliverable for" in found[0]

            result = score(scenario, await logged(), h.run_record())
            assert not result.passed
            lines = "\n".join(result.lines())
            assert "judged on what the scheduler at http://127.0.0.1:" in lines
            assert "gpu-node-07 expected drained: NEVER" in lines
            assert "gpu-node-07 drain decided at" in lines
            assert "NEVER REACHED A SCHEDULER" in lines
            assert lines.endswith("FAIL")

            h.apply("scheduler_up", {})
            await wait_until(lambda: h.applied, timeout=30, what="the drain applied")
            assert [(a["node"], a["action"]) for a in h.applied] == [("gpu-node-07", "drain")]
            result = score(scenario, await logged(), h.run_record())
            assert result.passed and not result.unapplied, result.lines()
            await wait_until(lambda: daemon.view.readiness().ready, what="ready again")
    finally:
        await h.stop()
    run = orjson.loads((tmp_path / "sim" / "run.json").read_bytes())
    assert run["applied"][0]["action"] == "drain" and run["scheduler"]["up"] is False
    assert [f["fault"] for f in run["faults"]] == ["scheduler_down", "scheduler_up"]


async def test_scheduler_faults_without_a_scheduler_say_how_to_get_one(harness: Harness) -> None:
    with pytest.raises(FaultError, match=r"serve runs no scheduler \(start it with --scheduler\)"):
        harness.apply("scheduler_down", {})
    assert harness.run_record()["scheduler"] is None


async def test_a_host_that_cannot_keep_the_speed_invalidates_the_run_and_its_score(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    scenario = load_scenario(str(_scenario(tmp_path)))
    options = ServeOptions(state_dir=tmp_path / "sim", speed=20.0, pdu_port=0, cdu_port=0)
    h = Harness(scenario, options)
    await h.start()
    runner = asyncio.create_task(h.run())
    try:
        await asyncio.sleep(0.3)
        time.sleep(0.6)  # noqa: ASYNC251 - the point: a stalled loop, 12 simulated seconds
        await wait_until(lambda: h.load.invalid, what="the stall noticed")
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        await h.stop()
    assert h.load.invalid.startswith("the event loop lagged ")
    assert h.load.invalid.endswith("(bound 0.25 s at x20): this host cannot keep x20")
    assert "INVALID RUN: " in caplog.text  # said at once
    run = orjson.loads((tmp_path / "sim" / "run.json").read_bytes())
    assert run["invalid"] == h.load.invalid
    result = score(scenario, [], run)
    assert not result.passed
    assert f"  run INVALID: {h.load.invalid}; lower --speed" in result.lines()


def test_a_speed_past_what_a_host_meets_is_named_before_the_run() -> None:
    assert poll_timeout_note(10.0) == ""  # 0.08 s timeouts
    note = poll_timeout_note(40.0)
    assert note.startswith("x40 gives the agents GPU poll timeouts of 0.020 s, below the 0.05 s")
    assert "(x16 or less is safe)" in note


def test_the_demo_lowers_an_asked_speed_a_host_cannot_keep_and_says_so_at_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert playable_speed(10.0, 900.0) == 10.0
    assert capsys.readouterr().err == ""  # a speed a busy host keeps is played as asked
    assert playable_speed(40.0, 900.0) == 16.0
    said = capsys.readouterr().err
    assert said.startswith("rackguard-sim demo: x40 gives the agents GPU poll timeouts of 0.020 s")
    assert said.rstrip().endswith("playing at x16 instead, about 1 min")
    assert playable_speed(None, 3600.0) == 16.0  # x60 would play it in a minute
    said = capsys.readouterr().err
    assert "x60 (the scenario in about a minute) gives" in said and "x16 instead" in said


async def test_the_run_record_lists_the_timelines_faults_beside_the_ones_played_by_hand(
    tmp_path: Path,
) -> None:
    path = tmp_path / "pump.toml"
    path.write_text(
        """
name = "pump"
description = "The pump fails at once."
duration_s = 600
[rack]
nodes = ["a-01"]
gpus_per_node = 1
[[events]]
at_s = 0
kind = "job_start"
target = "rack"
[[events]]
at_s = 0
kind = "pump_fail"
[[events]]
at_s = 500
kind = "pump_restore"
[expect]
"""
    )
    h = Harness(load_scenario(str(path)), ServeOptions(tmp_path / "sim", pdu_port=0, cdu_port=0))
    await h.start()
    try:
        h.apply("pdu_garbage", {})
        faults = h.run_record()["faults"]
    finally:
        await h.stop()
    # The job start is load, not a fault; the restore at 500 s has not happened yet.
    assert [(f["fault"], f.get("source")) for f in faults] == [
        ("pump_fail", "timeline"),
        ("pdu_garbage", None),
    ]
    assert faults[0]["t"] == 0.0 and faults[0]["params"]["target"] == "cdu"
