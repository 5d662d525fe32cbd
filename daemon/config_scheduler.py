"""The [scheduler] table: where decisions go."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from daemon.secrets import resolve_secret, secret_problem
from daemon.typed_toml import bounded

Problems = Iterator[tuple[str, str]]


@dataclass(frozen=True, slots=True)
class WebhookSchedulerConfig:
    """Decisions POSTed as signed JSON to an HTTP endpoint."""

    type: Literal["webhook"]
    url: str
    # HMAC-SHA256 key; the file's contents, never the key itself, live in config.
    secret_file: Path
    timeout_s: float = bounded(5.0, gt=0, le=120)
    retry_initial_s: float = bounded(1.0, gt=0)
    retry_max_s: float = bounded(60.0, gt=0)

    def validate(self) -> Problems:
        """URL shape, secret readability, retry bounds."""
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            yield "url", f"must be an http:// or https:// URL, got {self.url!r}"
        problem = secret_problem(resolve_secret(self.secret_file))
        if problem:
            yield "secret_file", problem
        if self.retry_max_s < self.retry_initial_s:
            yield "retry_max_s", f"must be at least retry_initial_s ({self.retry_initial_s})"


SchedulerConfig = WebhookSchedulerConfig
