"""[power_cap] and build_limiter: off by default, the helper in production, dry runs inert."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from adapters.sensors.power_limit import DirectNvmlLimiter, DryRunLimiter, HelperClient
from daemon.cli import main
from daemon.config import ConfigError, parse_config
from daemon.http.power_cap_metrics import PowerCapCollector
from daemon.service.power_limit import build_limiter
from fakes.nvml import fake_node
from tests.daemon.config.test_config import MINIMAL


def test_power_cap_is_off_by_default_and_builds_nothing() -> None:
    cfg = parse_config(MINIMAL)
    assert cfg.power_cap.enabled is False
    assert build_limiter(cfg) is None


def test_power_cap_builds_the_helper_client_from_the_config() -> None:
    cfg = parse_config(
        MINIMAL + '[power_cap]\nenabled = true\nhelper_socket = "/run/x/cap.sock"\n'
        "helper_timeout_s = 3\n"
    )
    limiter = build_limiter(cfg)
    assert limiter is not None
    client = limiter.inner
    assert isinstance(client, HelperClient)
    assert (client.socket_path, client.timeout_s) == (Path("/run/x/cap.sock"), 3.0)


@pytest.mark.parametrize(
    ("policy_dry", "cap_dry", "dry"),
    [(False, None, False), (True, None, True), (True, "false", False), (False, "true", True)],
)
async def test_power_cap_dry_run_follows_policy_unless_set(
    policy_dry: bool, cap_dry: str | None, dry: bool
) -> None:
    text = MINIMAL + f"[policy]\ndry_run = {str(policy_dry).lower()}\n"
    text += '[power_cap]\nenabled = true\nvia = "direct"\n'
    if cap_dry is not None:
        text += f"dry_run = {cap_dry}\n"
    fake = fake_node(count=1)
    fake.privileged = True
    limiter = build_limiter(parse_config(text), nvml=fake)
    assert limiter is not None
    try:
        assert isinstance(limiter.inner, DryRunLimiter) is dry
        await limiter.set_limit(fake.gpus[0].uuid, 300.0)
        assert fake.gpus[0].power_limit_w == (700.0 if dry else 300.0)
        if not dry:
            assert isinstance(limiter.inner, DirectNvmlLimiter)
    finally:
        await limiter.close()


@pytest.mark.parametrize(
    ("lines", "problem"),
    [
        ('helper_socket = "run/cap.sock"', "power_cap.helper_socket: must be an absolute path"),
        ('via = "sudo"', "power_cap.via"),
        ("helper_timeout_s = 0", "power_cap.helper_timeout_s: must be greater than 0"),
        ('dry_run = "yes"', "power_cap.dry_run"),
        ("enable = true", "power_cap.enable: unknown key"),
    ],
)
def test_power_cap_check_config_refuses_bad_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], lines: str, problem: str
) -> None:
    text = MINIMAL + "[power_cap]\n" + lines + "\n"
    with pytest.raises(ConfigError, match=problem.replace(".", r"\.")):
        parse_config(text)
    path = tmp_path / "r.toml"
    path.write_text(text)
    assert main(["check-config", str(path)]) == 2
    assert problem in capsys.readouterr().err


async def test_power_cap_metrics_show_the_cap_and_its_range() -> None:
    text = MINIMAL + '[power_cap]\nenabled = true\nvia = "direct"\ndry_run = false\n'
    fake = fake_node(count=2)
    fake.privileged = True
    limiter = build_limiter(parse_config(text), nvml=fake)
    assert limiter is not None
    registry = CollectorRegistry()
    registry.register(PowerCapCollector(limiter.latest))
    try:
        assert "rackguard_gpu_power_cap_watts{" not in generate_latest(registry).decode()
        await limiter.limits()
        await limiter.set_limit(fake.gpus[1].uuid, 320.0)
        body = generate_latest(registry).decode()
        assert f'rackguard_gpu_power_cap_watts{{gpu="1",uuid="{fake.gpus[1].uuid}"}} 320.0' in body
        assert 'rackguard_gpu_power_cap_watts{gpu="0"' not in body  # at its default
        assert (
            f'rackguard_gpu_power_limit_default_watts{{gpu="0",uuid="{fake.gpus[0].uuid}"}} 700.0'
            in body
        )
        assert (
            f'rackguard_gpu_power_limit_min_watts{{gpu="0",uuid="{fake.gpus[0].uuid}"}} 200.0'
            in body
        )
        fake.admin_set_limit(1, 700.0)  # an admin restores it: the next read shows no cap
        await limiter.limits()
        assert "rackguard_gpu_power_cap_watts{" not in generate_latest(registry).decode()
    finally:
        await limiter.close()
