"""The [steering] table: check-config refuses (exit 2, naming the key) what run would refuse."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon.cli import main
from daemon.config import ConfigError, parse_config
from tests.daemon.config.test_config import MINIMAL

SLURM = '[scheduler]\ntype = "slurm"\noutbox_path = ":memory:"\n'


def test_steering_is_off_by_default_and_the_defaults_are_valid() -> None:
    cfg = parse_config(MINIMAL)
    assert cfg.steering.enabled is False
    on = parse_config(MINIMAL + SLURM + "[steering]\nenabled = true\n")
    assert on.steering.enabled and on.steering.weights == (4, 3, 2, 1)


@pytest.mark.parametrize(
    ("lines", "problem"),
    [
        ("edges_c = [10.0, 5.0]", "steering.edges_c: must be strictly ascending"),
        ("edges_c = []", "steering.edges_c: at least one edge"),
        ("weights = [3, 2, 1]", "steering.weights: must hold one weight per bucket: 4"),
        ("weights = [1, 2, 3, 4]", "steering.weights: must be strictly decreasing"),
        ("weights = [4, 3, 2, 0]", "steering.weights: each must be from 1 to"),
        ("hysteresis_c = 2.5", "steering.hysteresis_c: must be under half the narrowest"),
        ("hysteresis_c = -1", "steering.hysteresis_c: must be at least 0"),
        ("min_interval_s = -5", "steering.min_interval_s: must be at least 60"),
        ("interval_s = 0", "steering.interval_s: must be at least 10"),
        ('label_key = "Thermal Headroom"', "steering.label_key: not a valid Kubernetes label"),
        ('weights = ["4"]', "steering.weights[0]: must be an integer"),
        ("enable = true", "steering.enable: unknown key"),
    ],
)
def test_check_config_refuses_bad_steering(
    tmp_path: Path, lines: str, problem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    text = MINIMAL + SLURM + f"[steering]\nenabled = true\n{lines}\n"
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    assert any(p.startswith(problem) for p in info.value.problems), info.value.problems
    path = tmp_path / "c.toml"
    path.write_text(text)
    assert main(["check-config", str(path)]) == 2
    assert problem in capsys.readouterr().err


def test_steering_needs_a_scheduler_with_a_node_setting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "c.toml"
    path.write_text(MINIMAL + "[steering]\nenabled = true\n")
    assert main(["check-config", str(path)]) == 2
    assert "steering.enabled: steering needs [scheduler] type 'slurm'" in capsys.readouterr().err
    # Disabled, it is no problem without one.
    path.write_text(MINIMAL + "[steering]\nenabled = false\n")
    assert main(["check-config", str(path)]) == 0
