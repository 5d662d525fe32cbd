"""Secrets the tests share (the webhook's HMAC key, known to the fake receiver)."""

from __future__ import annotations

from pathlib import Path

WEBHOOK_SECRET = b"test-webhook-secret"


def write_secret(path: Path, content: str | bytes) -> Path:
    """Write a secret file as an operator must: private (0600), or rackguard refuses it."""
    data = content.encode() if isinstance(content, str) else content
    path.write_bytes(data)
    path.chmod(0o600)
    return path
