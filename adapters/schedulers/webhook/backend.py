"""A webhook as a backend: delivery only (it cannot read, list, tell jobs or steer)."""

from __future__ import annotations

from adapters.schedulers.webhook.sink import WebhookSink


class WebhookBackend:
    """Signed decisions POSTed to one URL."""

    name = "webhook"

    def __init__(self, sink: WebhookSink) -> None:
        self._sink = sink  # its own client: one session to one URL

    def sink(self) -> WebhookSink:
        """The signed POST of each decision."""
        return self._sink

    def lister(self) -> None:
        """A webhook lists no nodes."""

    def job_control(self) -> None:
        """A webhook's receiver tells its own jobs (``checkpoint_by``)."""

    def node_setting(self, label_key: str) -> None:
        """Nothing to steer."""
