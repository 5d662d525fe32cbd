"""Scraping a live daemon's /metrics, as Prometheus would."""

from __future__ import annotations

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[str, list[tuple[dict[str, str], float]]]


async def scrape_text(port: int | None) -> str:
    """The /metrics body; asserts the exposition format's content type."""
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{port}/metrics") as resp,
    ):
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return await resp.text()


def samples(text: str) -> Samples:
    """Sample name -> [(labels, value)]."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


async def scrape(port: int | None) -> Samples:
    """One scrape, parsed."""
    return samples(await scrape_text(port))
