"""Fuzz the API of a real daemon process: malformed requests never get a 5xx or crash it."""

from __future__ import annotations

import http.client
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from urllib.parse import quote

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.daemon_harness import SIMULATED_RACKGUARD, config_text
from tests.support.openapi import check
from tests.support.paths import ROOT
from tests.support.secrets import write_secret

TOKEN = "fuzz-token"
PATHS = [
    "/healthz",
    "/readyz",
    "/openapi.json",
    "/metrics",
    "/v1/state",
    "/v1/assessments",
    "/v1/decisions",
    "/v1/outbox",
    "/v1/events",
    "/v1/overrides",
    "/v1/node/notice",
    "/v1/notices",
    "/",
    "/static/page.js",
]
PARAMS = ["node", "action", "kind", "since", "until", "limit", "cursor", "last_event_id"]
EXAMPLES = 2200

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)  # orjson's range
    | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)
override_like = st.fixed_dictionaries(
    {},
    optional={
        "action": st.sampled_from(["pin", "unpin", "pause_predictive", "reset_storm", "x", ""])
        | json_values,
        "node": st.text(max_size=300) | json_values,
        "pin": st.sampled_from(["never_drain", "excluded", "maybe"]) | json_values,
        "reason": st.text(max_size=300) | json_values,
        "actor": st.text(max_size=10),
        "extra": json_values,
    },
)
bodies = (
    st.binary(max_size=300)
    | json_values.map(orjson.dumps)
    | override_like.map(orjson.dumps)
    | st.integers(17_000, 70_000).map(lambda n: b"{" * n)  # over the body limit
)
paths = st.sampled_from(PATHS) | st.text(max_size=40).map(lambda t: "/" + quote(t, safe="/"))
queries = st.dictionaries(
    st.sampled_from(PARAMS) | st.text(max_size=8), st.text(max_size=40), max_size=4
).map(lambda q: "&".join(f"{quote(k)}={quote(v)}" for k, v in q.items()))
methods = st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD", "BREW"])
auth = st.sampled_from([None, "Bearer fuzz-token", "Bearer wrong", "Basic abc", "Bearer", ""])
ctype = st.sampled_from([None, "application/json", "text/plain", "application/json; charset=x"])
# Header values travel as latin-1 (HTTP/1.1); control characters cannot be sent at all.
event_ids = st.none() | st.text(
    st.characters(max_codepoint=255, exclude_categories=["Cc"]), max_size=12
)


@pytest.fixture(scope="module")
def daemon_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    tmp = tmp_path_factory.mktemp("fuzz")
    write_secret((tmp / "key"), "k")
    write_secret((tmp / "token"), TOKEN)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    cfg = tmp / "rg.toml"
    cfg.write_text(
        config_text(
            "http://127.0.0.1:9/none",
            tmp / "key",
            port=port,
            api_extra=f'token_file = "{tmp / "token"}"',
            scheduler_extra=f'outbox_path = "{tmp / "outbox.db"}"',
        )
    )
    proc = subprocess.Popen(
        [*SIMULATED_RACKGUARD, "run", "--config", str(cfg)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 20
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
        except OSError:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline
            time.sleep(0.05)
    yield port
    proc.terminate()
    assert proc.wait(timeout=10) == 0  # it survived the fuzzing and stops cleanly
    err = proc.stderr.read().decode() if proc.stderr else ""
    assert "Traceback" not in err, err[-3000:]
    # 2,200 hostile requests are the clients' problem: a few state changes and
    # overrides at most, never a record per request.
    assert len(err.splitlines()) < 300, err[-3000:]


def request(
    port: int, method: str, target: str, body: bytes | None, headers: dict[str, str]
) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request(method, target, body=body, headers=headers)
        resp = conn.getresponse()  # headers only: an event stream is not read to its end
        json = resp.getheader("Content-Type", "").startswith("application/json")
        if resp.status >= 400 and json and method != "HEAD":
            check("Error", orjson.loads(resp.read()))  # every refusal in the one error shape
        return resp.status
    finally:
        conn.close()


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    method=methods,
    path=paths,
    query=queries,
    body=st.none() | bodies,
    token=auth,
    content_type=ctype,
    event_id=event_ids,
)
def test_malformed_requests_never_get_a_5xx(
    daemon_port: int,
    method: str,
    path: str,
    query: str,
    body: bytes | None,
    token: str | None,
    content_type: str | None,
    event_id: str | None,
) -> None:
    headers: dict[str, str] = {}
    if token is not None:
        headers["Authorization"] = token
    if content_type is not None:
        headers["Content-Type"] = content_type
    if event_id is not None:
        headers["Last-Event-ID"] = event_id
    target = path + ("?" + query if query else "")
    status = request(daemon_port, method, target, body, headers)
    assert status < 500, (method, target, body[:80] if body else body, headers)
    if method == "POST" and path == "/v1/overrides" and token != f"Bearer {TOKEN}":
        assert status in (401, 413), status  # never applied without the token


def test_still_healthy_after_fuzzing(daemon_port: int) -> None:
    # An unknown method with garbage bytes: a 400, and (checked at teardown) no
    # traceback in the daemon's log.
    assert request(daemon_port, "BREW", "/%F1%85%9E?%F2=%C3", None, {}) == 400
    assert request(daemon_port, "GET", "/healthz", None, {}) == 200
