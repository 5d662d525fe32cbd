"""The REST exchanges rackguard makes with slurmrestd, as recorded from a real Slurm 24.11.

One list (``EXCHANGES``), played in order against a server: the real one (its answers are
kept in ``tests/fixtures/slurm24/exchanges-<version>.json`` and checked still to be the
same) and the fake (whose answers must have the same shape). ``RACKGUARD_RECORD=1``
rewrites the recordings from the real server.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import aiohttp

from tests.support.paths import ROOT

FIXTURES = ROOT / "tests" / "fixtures" / "slurm24"
Auth = Literal["root", "nobody", "none", "bad"]
# A job id Slurm never gave out here, and the first one of a federation member.
UNKNOWN_JOB = 999999
FEDERATION_JOB = 0x04000000
SIGNAL = "signal=USR1&flags=FULL_JOB"


@dataclass(frozen=True, slots=True)
class Exchange:
    """One request: ``{v}`` in the path is the data-parser version."""

    name: str
    method: str
    path: str
    body: dict[str, Any] | None = None
    auth: Auth = "root"
    # False: the answer depends on what ran before (jobs finished minutes ago are still
    # listed, and an empty list carries a warning): compared by shape only.
    steady: bool = True


EXCHANGES = (
    Exchange("nodes", "GET", "/slurm/{v}/nodes"),
    Exchange("node", "GET", "/slurm/{v}/node/gpu04"),
    Exchange("node_unknown", "GET", "/slurm/{v}/node/gpu99"),
    Exchange("drain", "POST", "/slurm/{v}/node/gpu04", {"state": ["DRAIN"], "reason": "rec"}),
    Exchange("drained", "GET", "/slurm/{v}/node/gpu04"),
    Exchange("resume", "POST", "/slurm/{v}/node/gpu04", {"state": ["RESUME"]}),
    Exchange("resume_idle", "POST", "/slurm/{v}/node/gpu04", {"state": ["RESUME"]}),
    Exchange("drain_unknown", "POST", "/slurm/{v}/node/gpu99", {"state": ["DRAIN"], "reason": "x"}),
    Exchange("state_unknown", "POST", "/slurm/{v}/node/gpu04", {"state": ["BOGUS"]}),
    Exchange("drain_not_admin", "POST", "/slurm/{v}/node/gpu04", {"state": ["DRAIN"]}, "nobody"),
    Exchange("no_token", "GET", "/slurm/{v}/nodes", auth="none"),
    Exchange("bad_token", "GET", "/slurm/{v}/nodes", auth="bad"),
    Exchange("version_not_served", "GET", "/slurm/v0.0.39/nodes"),
    Exchange("jobs", "GET", "/slurm/{v}/jobs/", steady=False),
    Exchange("signal_unknown_job", "DELETE", f"/slurm/{{v}}/job/{UNKNOWN_JOB}?{SIGNAL}"),
    Exchange("signal_federation_job", "DELETE", f"/slurm/{{v}}/job/{FEDERATION_JOB}?{SIGNAL}"),
    Exchange(
        "signal_flag_unknown", "DELETE", f"/slurm/{{v}}/job/{UNKNOWN_JOB}?signal=USR1&flags=NOPE"
    ),
    Exchange(
        "signal_name_unknown",
        "DELETE",
        f"/slurm/{{v}}/job/{UNKNOWN_JOB}?signal=WINCH&flags=FULL_JOB",
    ),
    Exchange(
        "signal_jobs_unknown",
        "DELETE",
        "/slurm/{v}/jobs/",
        {"jobs": [str(UNKNOWN_JOB)], "signal": "USR1", "flags": ["FULL_JOB"]},
    ),
)


@dataclass(frozen=True, slots=True)
class Answer:
    """What the server said: the status and the body (JSON without ``meta``, else text)."""

    status: int
    body: Any

    def as_json(self) -> dict[str, Any]:
        return {"status": self.status, "body": self.body}


def headers(auth: Auth, tokens: dict[str, str]) -> dict[str, str]:
    if auth == "none":
        return {}
    if auth == "bad":
        return {"X-SLURM-USER-NAME": "root", "X-SLURM-USER-TOKEN": "not-a-token"}
    return {"X-SLURM-USER-NAME": auth, "X-SLURM-USER-TOKEN": tokens[auth]}


async def play(url: str, tokens: dict[str, str], version: str) -> dict[str, Answer]:
    """Every exchange, in order, against the server at ``url``; answers by name."""
    out: dict[str, Answer] = {}
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for ex in EXCHANGES:
            hdrs = headers(ex.auth, tokens)
            data = None
            if ex.body is not None:
                data = json.dumps(ex.body)
                hdrs["Content-Type"] = "application/json"
            path = ex.path.format(v=version)
            async with session.request(ex.method, url + path, data=data, headers=hdrs) as resp:
                raw = await resp.read()
                out[ex.name] = Answer(resp.status, _body(raw))
    return out


def _body(raw: bytes) -> Any:
    try:
        body = json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace").strip()
    if isinstance(body, dict):
        body.pop("meta", None)
    return body


def recording(version: str) -> dict[str, Answer]:
    """The recorded answers of the real 24.11 server at ``version``."""
    data = json.loads((FIXTURES / f"exchanges-{version}.json").read_text())
    return {name: Answer(a["status"], a["body"]) for name, a in data["answers"].items()}


def record(version: str, answers: dict[str, Answer], release: str) -> Path:
    """Write the recording of ``version`` (RACKGUARD_RECORD=1)."""
    FIXTURES.mkdir(parents=True, exist_ok=True)
    path = FIXTURES / f"exchanges-{version}.json"
    data = {
        "recorded_from": f"Slurm {release} slurmrestd (Debian 13), scripts/start-slurm24.sh",
        "requests": {e.name: [e.method, e.path, e.body, e.auth] for e in EXCHANGES},
        "answers": {n: a.as_json() for n, a in answers.items()},
    }
    path.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    return path


def comparable(answer: Answer) -> Answer:
    """What must not change between the recording and the server: the status and Slurm's
    errors, warnings and per-job statuses (node and job contents change run to run)."""
    body = answer.body
    if isinstance(body, dict):
        body = {k: body[k] for k in ("errors", "warnings", "status") if k in body}
    return Answer(answer.status, body)


def answer_problems(real: Answer, other: Answer) -> list[str]:
    """Where ``other`` does not answer like ``real``: the status, then the shape."""
    if real.status != other.status:
        return [f"HTTP {other.status}, real {real.status}"]
    return shape_problems(real.body, other.body)


def shape_problems(real: Any, fake: Any, where: str = "") -> list[str]:
    """Where the fake's answer does not have the real one's shape.

    Same JSON types; every key the fake sends, the real one sends too; the top level
    has the same keys; ``errors``/``status`` carry the same Slurm error numbers.
    """
    problems: list[str] = []
    kind_real, kind_fake = _kind(real), _kind(fake)
    if kind_real != kind_fake:
        return [f"{where or 'body'}: real {kind_real}, fake {kind_fake}"]
    if isinstance(real, dict) and isinstance(fake, dict):
        if not where and set(real) != set(fake):
            problems.append(f"top-level keys: real {sorted(real)}, fake {sorted(fake)}")
        for key, value in fake.items():
            if key not in real:
                problems.append(f"{where}.{key}: only the fake sends it")
            else:
                problems += shape_problems(real[key], value, f"{where}.{key}")
        for key in ("errors", "status"):
            if key in real and key in fake and _numbers(real[key]) != _numbers(fake[key]):
                problems.append(
                    f"{where}.{key}: real {_numbers(real[key])}, fake {_numbers(fake[key])}"
                )
    elif isinstance(real, list) and isinstance(fake, list) and real and fake:
        problems += shape_problems(real[0], fake[0], f"{where}[0]")
    return problems


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    return type(value).__name__


def _numbers(items: Any) -> list[int]:
    out = []
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict):
            error = item.get("error")
            number = error.get("code") if isinstance(error, dict) else item.get("error_number")
            out.append(number if isinstance(number, int) else -1)
    return out
