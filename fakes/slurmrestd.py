"""A fake slurmrestd (Slurm >= 23.02 REST write path) on loopback.

It reproduces the exchanges recorded from a real Slurm 24.11 (Debian 13's 24.11.5:
``tests/fixtures/slurm24/exchanges-<version>.json``, which
``tests/adapters/schedulers/test_slurm24_fake.py`` holds it to, and
``shared/data/slurm/slurmrestd-24.11-transcript.txt``): node state lists
(["IDLE", "DRAIN"]), ``{"errors": [], "warnings": []}`` on success, HTTP 500
with error 2018 (unknown node), 2028 (invalid state, e.g. RESUME of a node that
is neither drained nor down), 9207 + 2028 (an unknown state word), 2010 (a user
who is not an administrator), 401 ``Authentication failure`` without a token
and 511 with error 1007 for a bad one; a one-node read of an unknown node is 200 with
error 0 "No error" and no ``nodes``; RESUME keeps the reason and leaves NOT_RESPONDING set
for a moment. Versions below v0.0.39 answer a node POST with 405, like 22.05.

Every accepted write is recorded (``writes``) with the state before and after,
so tests can assert that nothing was applied twice.

Running jobs (``add_job``), as recorded: the job list ``GET /slurm/<v>/jobs/``
(``job_state`` a list, ``nodes`` a hostlist, ``job_id`` a number, ``het_job_id`` /
``array_job_id`` numbers of ``{"set", "infinite", "number"}``; a warning "Zero jobs
to dump" when empty), the signal ``DELETE /slurm/<v>/job/{job_id}?signal=&flags=``
and ``DELETE /slurm/<v>/jobs/`` with a ``kill_jobs_msg`` body. Only v0.0.42 says
per job what became of a signal on the singular path (``status[]``: empty when
sent, 2017 for a job Slurm does not know, 2021 for one already completed, all
HTTP 200); v0.0.40/41 answer 200 with no errors either way. 2002 for a user who
neither owns the job nor administers. Ids from MAX_JOB_ID on (federation ids):
HTTP 404 with 2017, before slurmctld is asked. An unknown flag: HTTP 500, 9207.
An unknown signal name: on v0.0.41/42 HTTP 200 with error 0 "No error" — and
the job is killed (SIGKILL, measured); on v0.0.40 HTTP 500 with error 22.
There is no REST requeue in v0.0.42: :meth:`FakeSlurmrestd.scontrol` answers
``scontrol requeue`` as Slurm does (``fakes/scontrol.py`` is the command).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

USER = web.RequestKey("user", str)
KNOWN_STATES = {"DRAIN", "RESUME", "DOWN", "UNDRAIN", "IDLE", "FAIL"}
# DELETE /slurm/<v>/job/{job_id}: the ``flags`` values v0.0.42 documents.
SIGNAL_FLAGS = {
    "BATCH_JOB",
    "ARRAY_TASK",
    "FULL_STEPS_ONLY",
    "FULL_JOB",
    "FEDERATION_REQUEUE",
    "HURRY",
    "OUT_OF_MEMORY",
    "NO_SIBLING_JOBS",
    "RESERVATION_JOB",
    "VERBOSE",
    "CRON_JOBS",
    "WARNING_SENT",
}
# The signal names slurmrestd 24.11 parses (every other name Python knows is refused).
SIGNALS = {
    "ABRT", "ALRM", "CHLD", "CONT", "HUP", "INT", "KILL", "PIPE", "QUIT",
    "STOP", "TERM", "TSTP", "TTIN", "TTOU", "URG", "USR1", "USR2", "XCPU",
}  # fmt: skip


def expand_hostlist(expr: str) -> list[str]:
    """``gpu[02-03,05]`` -> gpu02, gpu03, gpu05 (one bracket group, as Slurm writes them)."""
    m = re.fullmatch(r"([^\[\]]*)\[([^\]]+)\]([^\[\]]*)", expr)
    if not m:
        return [n for n in expr.split(",") if n]
    prefix, body, suffix = m.groups()
    out: list[str] = []
    for part in body.split(","):
        lo, _, hi = part.partition("-")
        width = len(lo)
        for i in range(int(lo), int(hi or lo) + 1):
            out.append(f"{prefix}{i:0{width}d}{suffix}")
    return out


@dataclass
class FakeNode:
    """One node as slurmctld holds it."""

    name: str
    base: str = "IDLE"  # IDLE or DOWN
    flags: list[str] = field(default_factory=list)
    reason: str = ""
    reason_set_by_user: str = "root"
    not_responding_until: float = 0.0
    features: list[str] = field(default_factory=list)  # e.g. ["rack_a"]: the node's rack
    reason_changed_at: int = 0  # wall seconds; 0: never set
    weight: int = 1  # the scheduling weight (slurm.conf Weight=, default 1)

    def states(self, now: float) -> list[str]:
        """Base state then flags, as v0.0.40+ report them."""
        extra = ["NOT_RESPONDING"] if now < self.not_responding_until else []
        return [self.base, *self.flags, *extra]

    def held(self) -> str:
        """A compact form for the write log: IDLE, IDLE+DRAIN, DOWN, ..."""
        return "+".join([self.base, *self.flags])


@dataclass
class FakeJob:
    """One batch job as slurmctld holds it."""

    job_id: int
    nodes: list[str]
    name: str = "train"
    user: str = "alice"
    state: str = "RUNNING"  # RUNNING, PENDING, COMPLETED
    requeue: bool = True  # sbatch --requeue (the default) / --no-requeue
    restarts: int = 0
    signals: list[tuple[str, str]] = field(default_factory=list)  # (signal, flags) received
    het_job_id: int = 0  # the leader's id for a heterogeneous job's components
    het_job_offset: int = 0
    array_job_id: int = 0  # the array's id for an array task
    array_task_id: int | None = None


@dataclass(frozen=True, slots=True)
class Write:
    """One node update slurmctld accepted."""

    node: str
    state: str
    reason: str | None
    before: str
    after: str
    user: str
    at: float


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.lstrip("v").split("."))


def _weight(raw: Any) -> int | str | None:
    """A node update's weight: a uint32_no_val ({"set", "infinite", "number"}) or a bare
    integer, as the data_parser takes either; None when absent, the problem as text."""
    if raw is None:
        return None
    if isinstance(raw, dict):
        if raw.get("infinite") or not raw.get("set", True):
            return "weight: an unset or infinite weight is not a node weight"
        raw = raw.get("number")
    if isinstance(raw, bool) or not isinstance(raw, int) or not 0 <= raw < 2**32 - 1:
        return f"weight: expected an unsigned 32-bit integer, got {raw!r}"
    return raw


def _errors(*items: tuple[str, int, str], source: str = "") -> dict[str, Any]:
    """Slurm's errors; ``source`` names where slurmrestd found them, as it does."""
    return {
        "errors": [
            {"description": d, "error_number": n, "error": e, "source": source} for e, n, d in items
        ],
        "warnings": [],
    }


def _number(value: int, *, is_set: bool = True) -> dict[str, Any]:
    return {"set": is_set, "infinite": False, "number": value}


NOT_FOUND = "Unable find requested URL. Please view /openapi/v3 for API reference."


class FakeSlurmrestd:
    """slurmrestd + slurmctld node state, with fault controls."""

    def __init__(
        self,
        nodes: Iterable[str] = ("gpu01", "gpu02", "gpu03", "gpu04"),
        *,
        versions: Iterable[str] = ("v0.0.40", "v0.0.41", "v0.0.42"),
        tokens: dict[str, str] | None = None,
        admins: Iterable[str] = ("root",),
        resume_settle_s: float = 0.0,
        racks: dict[str, str] | None = None,
    ) -> None:
        # ``racks``: node -> rack, served as the node feature ``rack_<rack>``.
        self.nodes = {n: FakeNode(n) for n in nodes}
        for name, rack in (racks or {}).items():
            self.nodes[name].features = [f"rack_{rack}"]
        self.versions = tuple(sorted(versions, key=_version_tuple))
        self.tokens = dict(tokens or {"root": "token-root"})
        self.admins = set(admins)
        self.resume_settle_s = resume_settle_s
        self.writes: list[Write] = []
        self.jobs: dict[int, FakeJob] = {}
        self._next_job = 1000
        self.requests: list[tuple[str, str]] = []
        self.auth_failures = 0
        # Fault controls: answer this status to the next N requests.
        self.fail_next = 0
        self.fail_body: dict[str, Any] | None = None  # JSON body of injected failures
        self.fail_status = 503
        self.fail_method = ""  # inject only into requests of this method ("": any)
        # ... or answer the next N node updates 200 without applying them (a lying server).
        self.drop_writes = 0
        # ... or apply the next N node updates but answer only after this many seconds.
        self.slow_writes = 0
        self.slow_write_s = 30.0
        self._runner: web.AppRunner | None = None
        self.port = 0
        self.url = ""

    # ------------------------------------------------------------------ control

    async def start(self, port: int | None = None) -> str:
        """Serve on 127.0.0.1 (the same port again after stop(), unless told otherwise)."""
        app = web.Application()
        app.router.add_get("/openapi/v3", self._openapi)
        app.router.add_get("/slurm/{version}/ping", self._ping)
        app.router.add_get("/slurm/{version}/nodes", self._get_nodes)
        app.router.add_get("/slurm/{version}/node/{name}", self._get_node)
        app.router.add_post("/slurm/{version}/node/{name}", self._post_node)
        app.router.add_post("/slurm/{version}/nodes", self._post_nodes)
        for jobs in ("/slurm/{version}/jobs", "/slurm/{version}/jobs/"):
            app.router.add_get(jobs, self._get_jobs)
        app.router.add_get("/slurm/{version}/job/{job_id}", self._get_job)
        app.router.add_delete("/slurm/{version}/job/{job_id}", self._delete_job)
        for jobs in ("/slurm/{version}/jobs", "/slurm/{version}/jobs/"):
            app.router.add_delete(jobs, self._delete_jobs)
        app.router.add_post("/fake/scontrol", self._scontrol)
        app.middlewares.append(self._middleware)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port if port is None else port)
        await site.start()
        self.port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{self.port}"
        return self.url

    async def stop(self) -> None:
        """Stop serving: connections are refused until start() again."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def admin_drain(self, node: str, reason: str, user: str = "admin") -> None:
        """An administrator's own drain, as ``scontrol update`` would make it."""
        n = self.nodes[node]
        if "DRAIN" not in n.flags:
            n.flags.append("DRAIN")
        n.reason, n.reason_set_by_user = reason, user
        n.reason_changed_at = int(time.time())

    def admin_resume(self, node: str) -> None:
        """An administrator resumes the node by hand."""
        n = self.nodes[node]
        n.base, n.flags = "IDLE", [f for f in n.flags if f != "DRAIN"]

    def add_job(
        self,
        *nodes: str,
        name: str = "train",
        user: str = "alice",
        requeue: bool = True,
        job_id: int | None = None,
    ) -> int:
        """A batch job RUNNING on ``nodes``; its job id (``job_id``, else the next one)."""
        if job_id is None:
            self._next_job += 1
            job_id = self._next_job
        self.jobs[job_id] = FakeJob(job_id, list(nodes), name, user, "RUNNING", requeue)
        return job_id

    def scontrol(self, argv: list[str]) -> tuple[int, str, str]:
        """``scontrol requeue JOB`` against this slurmctld: (rc, stdout, stderr) as 22.05 prints."""
        if len(argv) != 2 or argv[0] != "requeue":
            return 1, "", f"scontrol: error: fake scontrol knows only 'requeue JOB': {argv}"
        job = self.jobs.get(int(argv[1])) if argv[1].isdigit() else None
        if job is None:
            return 1, "", f"Invalid job id specified for job {argv[1]}"
        if job.state != "RUNNING":
            return 1, "", f"Job/step already completing or completed for job {argv[1]}"
        if not job.requeue:
            return 1, "", f"Requested operation is presently disabled for job {argv[1]}"
        job.state, job.restarts = "PENDING", job.restarts + 1
        return 0, "", ""

    # ------------------------------------------------------------------ HTTP

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.requests.append((request.method, request.path))
        if self.fail_next > 0 and self.fail_method in ("", request.method):
            self.fail_next -= 1
            if self.fail_body is not None:
                return web.json_response(self.fail_body, status=self.fail_status)
            return web.Response(status=self.fail_status, text="injected failure")
        user = request.headers.get("X-SLURM-USER-NAME", "")
        token = request.headers.get("X-SLURM-USER-TOKEN", "")
        bearer = request.headers.get("Authorization", "")
        if bearer.startswith("Bearer "):
            token = bearer.removeprefix("Bearer ")
            user = next((u for u, t in self.tokens.items() if t == token), "")
        if not token:
            self.auth_failures += 1
            return web.Response(status=401, text="Authentication failure")
        if self.tokens.get(user) != token:
            self.auth_failures += 1
            failure = ("Protocol authentication error", 1007, _failure(request))
            return self._json(_errors(failure, source=_source(request)), 511)
        request[USER] = user
        resp: web.StreamResponse = await handler(request)
        return resp

    def _check_version(self, request: web.Request) -> str:
        version = request.match_info["version"]
        if version not in self.versions:
            raise web.HTTPNotFound(text=NOT_FOUND)
        return version

    def _node_json(self, node: FakeNode, version: str) -> dict[str, Any]:
        states = node.states(time.monotonic())
        out: dict[str, Any] = {
            "name": node.name,
            "reason": node.reason,
            "reason_set_by_user": node.reason_set_by_user,
            "features": node.features,
            "weight": node.weight,
        }
        if _version_tuple(version) >= (0, 0, 39):
            out["state"] = states
            at = node.reason_changed_at
            out["reason_changed_at"] = {"set": at > 0, "infinite": False, "number": at}
        else:
            out["reason_changed_at"] = node.reason_changed_at
            out["state"] = states[0].lower()
            out["state_flags"] = states[1:]
        return out

    @staticmethod
    def _json(body: Any, status: int = 200) -> web.Response:
        return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")

    async def _openapi(self, request: web.Request) -> web.Response:
        paths: dict[str, Any] = {}
        for v in self.versions:
            paths[f"/slurm/{v}/ping"] = {"get": {}}
            paths[f"/slurm/{v}/jobs/"] = {"get": {}, "delete": {}}
            paths[f"/slurm/{v}/job/{{job_id}}"] = {"get": {}, "post": {}, "delete": {}}
            paths[f"/slurm/{v}/nodes"] = {"get": {}}
            node: dict[str, Any] = {"get": {}}
            if _version_tuple(v) >= (0, 0, 39):
                node["post"] = {}
                node["delete"] = {}
                paths[f"/slurm/{v}/nodes"]["post"] = {}
            paths[f"/slurm/{v}/node/{{node_name}}"] = node
        return self._json({"openapi": "3.0.2", "paths": paths})

    async def _ping(self, request: web.Request) -> web.Response:
        self._check_version(request)
        return self._json({"pings": [{"hostname": "fake", "pinged": "UP"}], "errors": []})

    async def _get_nodes(self, request: web.Request) -> web.Response:
        version = self._check_version(request)
        nodes = [self._node_json(n, version) for n in self.nodes.values()]
        now = _number(int(time.time()))
        return self._json({"nodes": nodes, "last_update": now, "errors": [], "warnings": []})

    async def _get_node(self, request: web.Request) -> web.Response:
        version = self._check_version(request)
        name = request.match_info["name"]
        if name not in self.nodes:
            # 24.11: 200, error 0 "No error", no nodes (not 2018: that is for updates).
            failure = ("No error", 0, f"Failure to query node {name}")
            return self._json(_errors(failure, source="_dump_nodes"))
        nodes = [self._node_json(self.nodes[name], version)]
        now = _number(int(time.time()))
        return self._json({"nodes": nodes, "last_update": now, "errors": [], "warnings": []})

    async def _post_node(self, request: web.Request) -> web.Response:
        version = self._check_version(request)
        if _version_tuple(version) < (0, 0, 39):
            return web.Response(
                status=405,
                text="Requested REST method is not defined at URL. "
                "Please view /openapi/v3 for API reference.",
            )
        body = orjson.loads(await request.read())
        resp = self._update([request.match_info["name"]], body, request[USER], version)
        if self.slow_writes > 0:
            self.slow_writes -= 1
            await asyncio.sleep(self.slow_write_s)
        return resp

    async def _post_nodes(self, request: web.Request) -> web.Response:
        version = self._check_version(request)
        body = orjson.loads(await request.read())
        names = expand_hostlist(str(body.get("name", "")))
        resp = self._update(names, body, request[USER], version)
        if resp.status == 200:
            warning = (
                "Expected OpenAPI type=array (Slurm type=list) but got OpenAPI type=string "
                f'(Slurm type=string): "{body.get("name", "")}"'
            )
            return self._json({"errors": [], "warnings": [warning]})
        return resp

    def _update(
        self, names: list[str], body: dict[str, Any], user: str, version: str
    ) -> web.Response:
        states = [str(s).upper() for s in body.get("state") or []]
        reason = body.get("reason")
        for name in names:
            failure = f"Failure to update node {name}"
            unknown = [s for s in states if s not in KNOWN_STATES]
            if unknown:
                return self._json(_bad_state(unknown[0], failure, version), 500)
            if name not in self.nodes:
                invalid = ("Invalid node name specified", 2018, failure)
                return self._json(_errors(invalid, source="_update_node"), 500)
            if user not in self.admins:
                return self._json(
                    _errors(("Invalid user id", 2010, failure), source="_update_node"), 500
                )
            node = self.nodes[name]
            if "RESUME" in states and "DRAIN" not in node.flags and node.base != "DOWN":
                refused = ("Invalid node state specified", 2028, failure)
                return self._json(_errors(refused, source="_update_node"), 500)
        weight = _weight(body.get("weight"))
        if isinstance(weight, str):
            return self._json(_errors(("Unable to parse weight", 9202, weight)), 400)
        if self.drop_writes > 0:
            self.drop_writes -= 1
            return self._json({"errors": [], "warnings": []})
        now = time.monotonic()
        for name in names:
            node = self.nodes[name]
            before = node.held()
            if weight is not None:
                node.weight = weight
            for state in states:
                if state == "DRAIN":
                    if "DRAIN" not in node.flags:
                        node.flags.append("DRAIN")
                elif state == "DOWN":
                    node.base = "DOWN"
                elif state in ("RESUME", "UNDRAIN"):
                    was_drained = "DRAIN" in node.flags
                    node.flags = [f for f in node.flags if f != "DRAIN"]
                    if state == "RESUME":
                        node.base = "IDLE"
                    if was_drained:
                        node.not_responding_until = now + self.resume_settle_s
            if reason is not None and not any(s in ("RESUME", "UNDRAIN") for s in states):
                node.reason, node.reason_set_by_user = str(reason), user
                node.reason_changed_at = int(time.time())
            self.writes.append(
                Write(name, "+".join(states), reason, before, node.held(), user, time.time())
            )
        return self._json({"errors": [], "warnings": []})

    # ------------------------------------------------------------------ jobs

    def _job_json(self, job: FakeJob, version: str) -> dict[str, Any]:
        state: Any = [job.state] if _version_tuple(version) >= (0, 0, 39) else job.state
        task = job.array_task_id
        return {
            "job_id": job.job_id,
            "name": job.name,
            "user_name": job.user,
            "job_state": state,
            "nodes": compress_hostlist(job.nodes) if job.state == "RUNNING" else "",
            "batch_flag": True,
            "requeue": job.requeue,
            "restart_cnt": job.restarts,
            "het_job_id": _number(job.het_job_id),
            "het_job_offset": _number(job.het_job_offset),
            "array_job_id": _number(job.array_job_id),
            "array_task_id": _number(task or 0, is_set=task is not None),
        }

    async def _get_jobs(self, request: web.Request) -> web.Response:
        version = self._check_version(request)
        jobs = [self._job_json(j, version) for j in self.jobs.values()]
        now = _number(int(time.time()))
        warnings = [] if jobs else [{"description": "Zero jobs to dump", "source": ""}]
        body = {"jobs": jobs, "last_backfill": _number(0), "last_update": now}
        return self._json({**body, "errors": [], "warnings": warnings})

    async def _get_job(self, request: web.Request) -> web.Response:
        """One job by id; an id slurmctld does not know is error 2017, as slurm_load_job says."""
        version = self._check_version(request)
        raw_id = request.match_info["job_id"]
        job = self.jobs.get(int(raw_id)) if raw_id.isdigit() else None
        if job is None:
            failure = f"Unable to query JobId={raw_id}"
            return self._json(_errors(("Invalid job id specified", 2017, failure)), 500)
        return self._json({"jobs": [self._job_json(job, version)], "errors": [], "warnings": []})

    async def _delete_job(self, request: web.Request) -> web.Response:
        version = self._check_version(request)
        raw_id = request.match_info["job_id"]
        signal = request.query.get("signal", "KILL").upper().removeprefix("SIG")
        flags = request.query.get("flags", "FULL_JOB")
        refused = _bad_flags([flags], version)
        if refused is not None:
            # v0.0.42 still asks slurmctld, and says what it answered.
            if _version_tuple(version) >= (0, 0, 42) and raw_id.isdigit():
                error = self._signal(int(raw_id), "", flags, request[USER], dry=True)
                refused["status"] = [_kill_status(raw_id, error, self.jobs)]
            return self._json(refused, 500)
        task = re.fullmatch(r"(\d+)_(\d+)", raw_id)
        if task is not None:  # ARRAY_TASK names one task of an array (measured)
            array, index = int(task.group(1)), int(task.group(2))
            found = [
                j.job_id
                for j in self.jobs.values()
                if j.array_job_id == array and j.array_task_id == index
            ]
            raw_id = str(found[0]) if found else str(array)
        if not raw_id.isdigit() or not 0 < int(raw_id) < MAX_JOB_ID:
            # slurmrestd's handler, before slurmctld is asked.
            invalid = ("Invalid job id specified", 2017, f"Invalid JobID={raw_id} rejected")
            return self._json(_errors(invalid, source="op_handler_job"), 404)
        body: dict[str, Any] = {"errors": [], "warnings": []}
        if signal not in SIGNALS and not signal.isdigit():
            if version == "v0.0.40":
                unknown = ("Invalid argument", 22, "Unknown signal (null)")
                return self._json(_errors(unknown, source="#/signal/"), 500)
            # v0.0.41 on: "No error", and the job is sent the default, SIGKILL.
            body = _errors(("No error", 0, "Unknown signal (null)"), source="#/signal/")
            signal = "KILL"
        error = self._signal(int(raw_id), signal, flags, request[USER])
        if error is not None and error[1] == 2002:
            return self._json(_errors(error, source="_signal_job"), 500)
        if _version_tuple(version) >= (0, 0, 42):
            body["status"] = [_kill_status(raw_id, error, self.jobs)] if error else []
        return self._json(body)

    async def _delete_jobs(self, request: web.Request) -> web.Response:
        """``kill_jobs_msg``: the named jobs (``jobs``) are signalled; one status entry each."""
        version = self._check_version(request)
        body = orjson.loads(await request.read())
        signal = str(body.get("signal", "KILL")).upper().removeprefix("SIG")
        flags = [str(f) for f in body.get("flags") or []]
        refused = _bad_flags(flags, version)
        if refused is not None:
            return self._json(refused, 500)
        status = []
        for raw in body.get("jobs") or []:
            job_id = int(raw) if str(raw).isdigit() else 0
            error = self._signal(job_id, signal, "+".join(flags), request[USER])
            status.append(_kill_status(str(raw), error, self.jobs))
        return self._json({"status": status, "errors": [], "warnings": []})

    def _signal(
        self, job_id: int, signal: str, flags: str, user: str, *, dry: bool = False
    ) -> tuple[str, int, str] | None:
        """Signal one job as slurmctld does; the error (text, number, description) if not."""
        job = self.jobs.get(job_id)
        if job is None:
            return ("Invalid job id specified", 2017, "Invalid job id specified")
        if job.state == "COMPLETED":
            done = "Job/step already completing or completed"
            return (done, 2021, done)
        if user not in self.admins and user != job.user:
            return ("Access/permission denied", 2002, "Access/permission denied")
        if not dry:
            job.signals.append((signal, flags))
            if signal == "KILL":
                job.state = "COMPLETED"
        return None

    async def _scontrol(self, request: web.Request) -> web.Response:
        rc, out, err = self.scontrol([str(a) for a in orjson.loads(await request.read())])
        return self._json({"rc": rc, "stdout": out, "stderr": err})


MAX_JOB_ID = 0x03FFFFFF


def _bad_flags(flags: list[str], version: str) -> dict[str, Any] | None:
    """The data parser's refusal of an unknown signal flag (HTTP 500), or None."""
    unknown = [f for f in flags if f not in SIGNAL_FLAGS]
    if not unknown:
        return None
    parse = ("Data parser unable to parse invalid flag", 9207, f'Unknown flag "{unknown[0]}"')
    errors = _errors(parse, source="#/flags[0]/")
    if version == "v0.0.40":
        again = (parse[0], 9207, f'Parsing single flag "{unknown[0]}" failed')
        errors["errors"] += _errors(again, source="#/flags/")["errors"]
    return errors


def _bad_state(state: str, failure: str, version: str) -> dict[str, Any]:
    """A node update with a state word the data parser does not know."""
    parse = ("Data parser unable to parse invalid flag", 9207, f'Unknown flag "{state}"')
    first = _errors(parse, source="#/state[0]/")
    if version == "v0.0.40":
        then = _errors((parse[0], 9207, "Parsing flags failed"), source="#/state/")
    else:
        then = _errors(("Invalid node state specified", 2028, failure), source="_update_node")
    return {"errors": first["errors"] + then["errors"], "warnings": []}


def _failure(request: web.Request) -> str:
    """What slurmrestd says it failed to do when the token is refused."""
    return (
        "Failure to query nodes"
        if request.path.rstrip("/").endswith("/nodes")
        else (f"Failure on {request.method} {request.path}")
    )


def _source(request: web.Request) -> str:
    return "_dump_nodes" if request.path.rstrip("/").endswith("/nodes") else "op_handler"


def _kill_status(
    raw_id: str, error: tuple[str, int, str] | None, jobs: dict[int, FakeJob]
) -> dict[str, Any]:
    """One ``status`` entry of a kill response (an unknown job's id is not set)."""
    text, code, message = error if error is not None else ("No error", 0, "")
    known = raw_id.isdigit() and int(raw_id) in jobs
    return {
        "error": {"string": text, "code": code, "message": message},
        "step_id": raw_id,
        "job_id": _number(int(raw_id) if known else 0, is_set=known),
        "federation": {"sibling": ""},
    }


def compress_hostlist(names: Iterable[str]) -> str:
    """gpu01, gpu02, gpu04 -> ``gpu[01-02,04]``, as Slurm writes a job's nodes."""
    groups: dict[tuple[str, int], list[int]] = {}
    plain: list[str] = []
    for name in names:
        m = re.fullmatch(r"(.*?)(\d+)", name)
        if m is None:
            plain.append(name)
            continue
        groups.setdefault((m.group(1), len(m.group(2))), []).append(int(m.group(2)))
    out = list(plain)
    for (prefix, width), found in groups.items():
        numbers = sorted(set(found))
        if len(numbers) == 1:
            out.append(f"{prefix}{numbers[0]:0{width}d}")
            continue
        runs: list[list[int]] = []
        for n in numbers:
            if runs and n == runs[-1][-1] + 1:
                runs[-1].append(n)
            else:
                runs.append([n])
        parts = [f"{r[0]:0{width}d}" + (f"-{r[-1]:0{width}d}" if len(r) > 1 else "") for r in runs]
        out.append(f"{prefix}[{','.join(parts)}]")
    return ",".join(out)
