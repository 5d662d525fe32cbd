"""Secrets the tests share (the webhook's HMAC key, known to the fake receiver)."""

from __future__ import annotations

WEBHOOK_SECRET = b"test-webhook-secret"
