"""bench/agent_cost.py: the two daemons it runs side by side are valid and share nothing."""

from __future__ import annotations

from pathlib import Path

from bench.agent_cost import _config
from daemon.config import parse_config


def test_the_agent_and_its_reference_each_get_a_valid_config_and_their_own_outbox(
    tmp_path: Path,
) -> None:
    # Both once used the machine's default outbox: the second daemon was refused at
    # start ("in use by another rackguard process") and `make bench` failed.
    secret = tmp_path / "key"
    secret.write_text("bench")
    secret.chmod(0o600)
    configs = [
        parse_config(_config(port, interval, secret, tmp_path / f"{name}.sqlite3"))
        for name, port, interval in (("agent", 40001, 1.0), ("idle", 40002, 3600.0))
    ]
    outboxes = [c.scheduler.outbox_path if c.scheduler else None for c in configs]
    assert outboxes == [tmp_path / "agent.sqlite3", tmp_path / "idle.sqlite3"]
