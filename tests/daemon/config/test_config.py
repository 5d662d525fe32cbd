"""Config validation: every error names its key path; the shipped example loads."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from daemon.cli import main
from daemon.config import ConfigError, load_config, parse_config
from daemon.config.policy import PolicyConfig
from daemon.config.scheduler import SlurmSchedulerConfig, WebhookSchedulerConfig
from daemon.config.secrets import resolve_secret, secret_problem
from daemon.config.sources import NvmlSourceConfig
from tests.support.paths import ROOT
from tests.support.secrets import write_secret

EXAMPLE = ROOT / "systemd" / "rackguard.example.toml"

MINIMAL = """
[node]
name = "n1"
[sources.gpus]
type = "nvml"
"""


def with_secret(text: str, secret: Path) -> str:
    old = 'secret_file = "/etc/rackguard/webhook.key"'
    assert old in text
    return text.replace(old, f'secret_file = "{secret}"')


def test_example_config_loads(secret_file: Path) -> None:
    cfg = parse_config(with_secret(EXAMPLE.read_text(), secret_file))
    assert cfg.node.name == "gpu-node-01"
    assert cfg.sources["gpus"].interval_s == 1.0
    assert cfg.policy.exit_margin_c > cfg.policy.enter_margin_c
    assert isinstance(cfg.scheduler, WebhookSchedulerConfig)
    assert cfg.scheduler.secret_file == secret_file
    assert cfg.scheduler.outbox_path == Path("/var/lib/rackguard/outbox.sqlite3")


def test_example_documents_every_key() -> None:
    """Each key of the example has a comment above it (documented key by key)."""
    lines = EXAMPLE.read_text().splitlines()
    for i, line in enumerate(lines):
        if "=" in line and not line.startswith("#") and not line.startswith("["):
            key = line.split("=")[0].strip()
            above = lines[i - 1].strip()
            assert (
                above.startswith("#") or lines[i - 2].strip().startswith("#") or ("=" in above)
            ), f"key {key!r} in the example is not documented"


def test_minimal_config_gets_defaults() -> None:
    cfg = parse_config(MINIMAL)
    assert cfg.api.listen == "127.0.0.1"
    gpus = cfg.sources["gpus"]
    assert isinstance(gpus, NvmlSourceConfig) and gpus.binding == "pynvml"
    assert cfg.scheduler is None
    with pytest.raises(AttributeError):
        cfg.node.name = "x"  # type: ignore[misc]  # frozen


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (MINIMAL + "bogus = 1\n", "sources.gpus.bogus: unknown key"),
        (
            MINIMAL + "interval_s = 'fast'\n",
            "sources.gpus.interval_s: must be a number, got string",
        ),
        (MINIMAL + "interval_s = -1\n", "sources.gpus.interval_s: must be greater than 0"),
        (
            MINIMAL + "interval_s = 1.0\ntimeout_s = 2.0\n",
            "sources.gpus.timeout_s: must be less than interval_s",
        ),
        (
            MINIMAL + "down_after = true\n",
            "sources.gpus.down_after: must be an integer, got boolean",
        ),
        (MINIMAL + "gpus = [0, 'x']\n", "sources.gpus.gpus[1]: must be an integer"),
        (
            MINIMAL + "[policy]\nenter_margin_c = 8.0\nexit_margin_c = 6.0\n",
            "policy.exit_margin_c: exit threshold must be above enter_margin_c",
        ),
        # A bucket so small that the forecasts pending per series overflowed a deque.
        (
            MINIMAL + "[policy]\ntrend_bucket_s = 1e-300\ntrend_window_s = 1e-299\n",
            "policy.trend_bucket_s: must be at least 0.1",
        ),
        (
            MINIMAL + "[policy]\nskill_horizon_s = 1e300\n",
            "policy.skill_horizon_s: must be at most 1000 trend buckets",
        ),
        (MINIMAL + "[api]\nport = 70000\n", "api.port: must be at most 65535"),
        (MINIMAL + "[logging]\nlevel = 'loud'\n", "logging.level: must be one of"),
        ("[node]\nname='n1'\n[sources.g]\ntype='ipmi'\n", "sources.g.type: must be one of 'nvml'"),
        ("[sources.g]\ntype='nvml'\n", "node: required key is missing"),
        ("[node]\nname = 'a b'\n[sources.g]\ntype='nvml'\n", "node.name: must be a node name"),
        (
            '[node]\nname = "n\\u001b[2J"\n[sources.g]\ntype="nvml"\n',
            "node.name: must be printable",
        ),
        ('[node]\nname = "n1"\nrack = "r\\u0000"\n[sources.g]\ntype="nvml"\n', "node.rack"),
        (MINIMAL + "[sources.gpus.x]\n", "sources.gpus.x: unknown key"),
        ("[node]\nname='n1'\n[sources.g]\ntype=[]\n", "sources.g.type: must be one of"),
        (MINIMAL + "[api]\nmax_event_streams = 200\nmax_connections = 100\n", "max_event_streams"),
        (
            MINIMAL + "[scheduler]\ntype='webhook'\nurl='ftp://x'\nsecret_file='/nonexistent/k'\n",
            "scheduler.secret_file: secret file '/nonexistent/k' cannot be read",
        ),
        (
            MINIMAL + "[scheduler]\ntype='webhook'\nurl='ftp://x'\nsecret_file='/nonexistent/k'\n",
            "scheduler.url: must be an http:// or https:// URL",
        ),
        ("[node\n", "not valid TOML"),
        # Polled no faster than readings go stale: always UNKNOWN, never a decision.
        (
            MINIMAL + "interval_s = 5.0\ntimeout_s = 4.0\n",
            "sources.gpus.interval_s: 5 s is not under policy.stale_after_s (5 s)",
        ),
        (
            MINIMAL + "interval_s = 2.0\ntimeout_s = 1.0\n[policy]\nstale_after_s = 2.0\n",
            "sources.gpus.interval_s: 2 s is not under policy.stale_after_s (2 s)",
        ),
    ],
)
def test_config_errors_name_the_key(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    assert any(expected in p for p in info.value.problems), info.value.problems


def test_all_problems_reported_at_once() -> None:
    text = MINIMAL + "interval_s = 'x'\nbogus = 2\n[api]\nport = -1\n"
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    assert len(info.value.problems) == 3


def test_unreadable_secret_names_key(tmp_path: Path) -> None:
    secret = tmp_path / "k"
    write_secret(secret, "x")
    secret.chmod(0)
    text = MINIMAL + f"[scheduler]\ntype='webhook'\nurl='http://h/x'\nsecret_file='{secret}'\n"
    if secret.stat().st_uid == 0 and __import__("os").geteuid() == 0:
        # root reads anything: use an empty file to get the same key-naming error
        secret.chmod(0o600)
        write_secret(secret, "")
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    assert any(p.startswith("scheduler.secret_file:") for p in info.value.problems)


def test_check_config_cli_exit_2_with_key_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(MINIMAL + "interval_s = 'often'\n")
    assert main(["check-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "sources.gpus.interval_s" in err and "must be a number" in err


def test_check_config_cli_ok(tmp_path: Path, secret_file: Path) -> None:
    path = tmp_path / "good.toml"
    path.write_text(with_secret(EXAMPLE.read_text(), secret_file))
    assert main(["check-config", str(path)]) == 0


def test_check_config_as_a_process(tmp_path: Path) -> None:
    """The installed console entry point behaves the same from a shell."""
    path = tmp_path / "bad.toml"
    path.write_text(MINIMAL + "timeout_s = true\n")
    proc = subprocess.run(
        [sys.executable, "-m", "daemon.cli", "check-config", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert "sources.gpus.timeout_s: must be a number, got boolean" in proc.stderr


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "none.toml")
    assert "cannot read config" in info.value.problems[0]


def uncomment_block(text: str, header: str) -> str:
    """The example with one commented-out table switched on (its '# # ' lines stay comments)."""
    out, inside = [], False
    for line in text.splitlines():
        if line == f"# {header}":
            inside = True
        elif inside and not line.strip():
            inside = False
        # "# key = v" becomes "key = v"; "# # note" stays a comment.
        out.append(line[2:] if inside and line.startswith("# ") else line)
    return "\n".join(out)


@pytest.mark.parametrize(
    ("header", "source", "kind"),
    [("[sources.cdu]", "cdu", "opcua"), ("[sources.pdu-a]", "pdu-a", "snmp")],
)
def test_example_commented_sources_are_valid(
    secret_file: Path, header: str, source: str, kind: str
) -> None:
    example = with_secret(EXAMPLE.read_text(), secret_file)
    example = example.replace('"/etc/rackguard/pdu-a.community"', f'"{secret_file}"')
    text = uncomment_block(example, header)
    cfg = parse_config(text)
    assert cfg.sources[source].type == kind


def test_example_names_every_policy_key() -> None:
    """Every [policy] setting (one definition: policies/settings.py + the daemon's) is shown."""
    text = EXAMPLE.read_text()
    for f in dataclasses.fields(PolicyConfig):
        key = "[policy.racks." if f.name == "racks" else f"\n{f.name} = "
        # TOML has no null: a key unset by default is shown commented out.
        unset = f.default is None and f"\n# {f.name} = " in text
        assert key in text or unset, f"{f.name} is not in the example's [policy] table"


def test_per_rack_limits_are_validated_with_key_paths() -> None:
    text = MINIMAL + "[policy.racks.rack-a]\ninlet_limit_c = 99.0\nsupply = 1\n"
    with pytest.raises(ConfigError) as err:
        parse_config(text)
    message = str(err.value)
    assert "policy.racks.rack-a.inlet_limit_c: must be at most 60, got 99.0" in message
    assert "policy.racks.rack-a.supply: unknown key" in message
    ok = parse_config(MINIMAL + "[policy.racks.rack-a]\ninlet_limit_c = 40.0\n")
    assert ok.policy.inlet_limit("rack-a") == 40.0 and ok.policy.inlet_limit("b") == 32.0


def test_every_policy_setting_carries_its_own_doc() -> None:
    for f in dataclasses.fields(PolicyConfig):
        assert f.metadata.get("doc"), f"policy setting {f.name} has no doc in its definition"


def slurm_example() -> str:
    """The example's commented-out Slurm [scheduler] table, switched on, after MINIMAL."""
    lines = EXAMPLE.read_text().splitlines()
    start = next(
        i
        for i, line in enumerate(lines[:-1])
        if line == "# [scheduler]" and "slurm" in lines[i + 1]
    )
    end = lines.index("", start)
    # "# key = v" becomes "key = v"; "# # note" stays a comment.
    block = [line.removeprefix("# ") for line in lines[start:end]]
    return MINIMAL + "\n".join(block) + "\n"


def test_the_example_slurm_block_loads_with_the_defaults() -> None:
    cfg = parse_config(slurm_example())
    assert isinstance(cfg.scheduler, SlurmSchedulerConfig)
    defaults = SlurmSchedulerConfig(type="slurm")
    for key in ("exclude_state", "notice_signal", "notice_scope", "checkpoint_grace_s"):
        assert getattr(cfg.scheduler, key) == getattr(defaults, key), key
    for key in ("checkpoint_margin_s", "critical_grace_s", "requeue", "squeue", "scancel"):
        assert getattr(cfg.scheduler, key) == getattr(defaults, key), key
    assert cfg.scheduler.grace_s(cfg.policy.lead_time_s) == 540.0


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ('notice_signal = "KILL"', "scheduler.notice_signal: 'KILL' ends or stops the job"),
        ('notice_signal = "SIGUSR1"', "scheduler.notice_signal: must be a signal name without SIG"),
        ('notice_signal = "USR3"', "scheduler.notice_signal: must be a signal name"),
        ('exclude_state = "off"', "scheduler.exclude_state"),
        ("critical_grace_s = -1", "scheduler.critical_grace_s: must be at least 0"),
        (
            "checkpoint_grace_s = 600",
            "scheduler.checkpoint_grace_s: must be below policy.lead_time_s",
        ),
        ("squeue = []", "scheduler.squeue: must name the squeue command"),
    ],
)
def test_check_config_refuses_bad_notice_keys(
    tmp_path: Path, line: str, problem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    text = slurm_example()
    key = line.split(" = ", maxsplit=1)[0]
    text = "\n".join(f"{line}" if x.startswith(f"{key} = ") else x for x in text.splitlines())
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    assert any(p.startswith(problem) for p in info.value.problems), info.value.problems
    path = tmp_path / "c.toml"
    path.write_text(text)
    assert main(["check-config", str(path)]) == 2
    assert problem in capsys.readouterr().err


def test_a_bare_credential_name_outside_systemd_says_why_it_cannot_be_read(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    problem = secret_problem(resolve_secret(Path("webhook.key")))
    assert problem is not None
    assert "cannot be read" in problem and "$CREDENTIALS_DIRECTORY, which is not set" in problem
    # With the directory set, the same name resolves there and reads.
    (tmp_path / "creds").mkdir()
    key = tmp_path / "creds" / "webhook.key"
    key.write_text("k" * 32)
    key.chmod(0o600)
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path / "creds"))
    assert secret_problem(resolve_secret(Path("webhook.key"))) is None


def test_a_credential_path_the_service_cannot_read_is_read_from_its_systemd_copy(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The shipped config names the real file (/etc/rackguard/webhook.key,
    # root-only); under systemd the DynamicUser reads LoadCredential='s copy of it.
    creds = tmp_path / "creds"
    creds.mkdir()
    copy = creds / "webhook.key"
    copy.write_text("k" * 32)
    copy.chmod(0o600)
    unreadable = tmp_path / "root-only" / "webhook.key"  # cannot be opened from here
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))
    assert resolve_secret(unreadable) == copy
    assert secret_problem(resolve_secret(unreadable)) is None
    # A file the service can read is read where it is; no copy of that name: the path.
    readable = tmp_path / "webhook.key"
    readable.write_text("r" * 32)
    assert resolve_secret(readable) == readable
    other = tmp_path / "root-only" / "slurm.jwt"
    assert resolve_secret(other) == other
    # Outside systemd a path is only ever the path.
    monkeypatch.delenv("CREDENTIALS_DIRECTORY")
    assert resolve_secret(unreadable) == unreadable


def test_check_config_takes_the_shipped_example_with_its_secret_where_it_says(
    tmp_path: Path,
) -> None:
    # The example names its secret by path, so a root shell checks it as written,
    # without $CREDENTIALS_DIRECTORY (here the folder is moved under tmp_path).
    # Every /etc/rackguard path moves there, as a checker pointing the example at
    # temporary files would; only the secret needs to exist.
    key = tmp_path / "webhook.key"
    key.write_text("k" * 32)
    key.chmod(0o600)
    text = EXAMPLE.read_text().replace("/etc/rackguard/", f"{tmp_path}/")
    outbox = 'outbox_path = "/var/lib/rackguard/outbox.sqlite3"'
    text = text.replace(outbox, f'outbox_path = "{tmp_path / "outbox.sqlite3"}"', 1)
    config = tmp_path / "rackguard.toml"
    config.write_text(text)
    env = {k: v for k, v in os.environ.items() if k != "CREDENTIALS_DIRECTORY"}
    run = subprocess.run(
        [sys.executable, "-m", "daemon.cli", "check-config", str(config)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_check_config_refuses_a_gpu_index_this_node_lacks(
    tmp_path: Path, secret_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `run` stops at start on it (the first NVML connect), so check-config says it first.
    from fakes.nvml_module import simulated_node  # noqa: PLC0415

    text = with_secret(EXAMPLE.read_text(), secret_file)
    outbox = 'outbox_path = "/var/lib/rackguard/outbox.sqlite3"'
    text = text.replace(outbox, f'outbox_path = "{tmp_path / "o.sqlite3"}"', 1)
    assert "\ngpus = []\n" in text
    text = text.replace("\ngpus = []\n", "\ngpus = [8]\n", 1)
    path = tmp_path / "rg.toml"
    path.write_text(text)
    assert main(["check-config", str(path)], nvml=simulated_node()) == 2
    err = capsys.readouterr().err
    assert "sources.gpus.gpus: gpus: gpu_indices [8] do not exist: this node has 8 GPUs" in err
    # The same node's GPUs that exist: accepted.
    path.write_text(text.replace("gpus = [8]\n", "gpus = [0, 7]\n", 1))
    assert main(["check-config", str(path)], nvml=simulated_node()) == 0


@pytest.mark.parametrize(
    ("table", "problem"),
    [
        ("inlet_derate_limit_c = 46.0\n", "policy.inlet_derate_limit_c: must be at most 45"),
        ("inlet_derate_limit_c = 30.0\n", "policy.inlet_derate_limit_c: must be above"),
        (
            "inlet_derate_limit_c = 35.0\n[policy.racks.r1]\ninlet_limit_c = 35.0\n",
            "policy.racks.r1.inlet_limit_c: must be below the inlet_derate_limit_c in force",
        ),
        (
            "[policy.racks.r1]\ninlet_limit_c = 40.0\ninlet_derate_limit_c = 38.0\n",
            "policy.racks.r1.inlet_derate_limit_c: must be above the rack's inlet limit",
        ),
    ],
)
def test_check_config_refuses_a_power_cap_derate_limit_not_above_the_inlet_limit(
    tmp_path: Path, table: str, problem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    text = MINIMAL + ("" if table.startswith("[") else "[policy]\n") + table
    path = tmp_path / "c.toml"
    path.write_text(text)
    assert main(["check-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert problem in err and "Traceback" not in err
    assert len([x for x in err.splitlines() if x.startswith("  ")]) == 1, err  # one problem
    ok = parse_config(MINIMAL + "[policy]\ninlet_derate_limit_c = 35.0\n")
    assert ok.policy.inlet_derate_limit("any") == 35.0


def test_check_config_says_a_power_cap_derate_limit_without_power_capping_does_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Valid, so not refused; but without caps no GPU is derated: said, with the key."""
    path = tmp_path / "c.toml"
    derate = (
        "[policy]\ninlet_derate_limit_c = 35.0\n[policy.racks.r1]\ninlet_derate_limit_c = 40.0\n"
    )
    path.write_text(MINIMAL + derate)
    assert main(["check-config", str(path)]) == 0
    err = capsys.readouterr().err
    for key in ("policy.inlet_derate_limit_c", "policy.racks.r1.inlet_derate_limit_c"):
        assert f"rackguard: {key}: no effect while [power_cap] enabled = false" in err
    path.write_text(MINIMAL + derate + '[power_cap]\nenabled = true\nvia = "direct"\n')
    assert main(["check-config", str(path)]) == 0
    assert "no effect" not in capsys.readouterr().err


def test_a_rack_source_polled_no_faster_than_rack_readings_go_stale_is_refused(
    tmp_path: Path,
) -> None:
    secret = tmp_path / "community"
    write_secret(secret, "s3cret-community\n")
    text = (
        MINIMAL
        + f'[sources.pdu]\ntype = "snmp"\nhost = "pdu-a1"\ncommunity_file = "{secret}"\n'
        + "interval_s = 30.0\ntimeout_s = 5.0\n"
    )
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    assert info.value.problems == [
        "sources.pdu.interval_s: 30 s is not under policy.rack_stale_after_s (30 s): each"
        " reading would be stale before the next poll and the policy would decide nothing;"
        " poll more often or raise policy.rack_stale_after_s"
    ]
    assert parse_config(text.replace("interval_s = 30.0", "interval_s = 10.0")).sources[
        "pdu"
    ].interval_s == pytest.approx(10.0)
