"""Slurm job lists read as structured data: hostile job fields never move an action.

``squeue --json`` (22.05: every job, filters ignored) and slurmrestd's job list
carry a job's name and user as JSON strings; only the numbers and the node list
say which job runs where. These tests generate job names and users with ``|``,
newlines, NULs, Unicode, shell metacharacters and 64 KiB strings, and check
that the node's own jobs, all of them and nothing else, come out.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters.schedulers.slurm.job_list import (
    SHOWN_LIMIT,
    JobListError,
    convert,
    decode_json,
    running_on,
)

NODES = ["gpu01", "gpu02", "gpu03", "gpu04"]

hostile_text = st.one_of(
    st.text(max_size=40),
    st.text(alphabet="|\n\r\0\t;$`'\"\\&<>*", max_size=40),
    st.sampled_from(
        [
            "x|y\n7|a|b\n8|c",
            "ckpt|v2",
            "$(touch /tmp/pwned)",
            "; rm -rf / #",
            "\u202e\u0000\ufeff名前",
            "a" * 65536,
            "|" * 65536,
        ]
    ),
)


@st.composite
def job_lists(draw: st.DrawFn) -> list[dict[str, Any]]:
    count = draw(st.integers(min_value=0, max_value=12))
    jobs = []
    for i in range(count):
        kind = draw(st.sampled_from(["plain", "array", "het"]))
        job: dict[str, Any] = {
            "job_id": 100 + i,
            "name": draw(hostile_text),
            "user_name": draw(hostile_text),
            "comment": draw(hostile_text),
            "job_state": draw(st.sampled_from(["RUNNING", "PENDING", "COMPLETING"])),
            "nodes": draw(st.sampled_from([*NODES, "gpu[01-02]", "gpu[03-04]", ""])),
            "array_job_id": 0,
            "array_task_id": None,
            "het_job_id": 0,
            "het_job_offset": 0,
        }
        if kind == "array":
            job["array_job_id"], job["array_task_id"] = 90, i
        elif kind == "het":
            job["het_job_id"], job["het_job_offset"] = 100, i
        jobs.append(job)
    return jobs


def on(job: dict[str, Any], node: str) -> bool:
    nodes = {"gpu[01-02]": ["gpu01", "gpu02"], "gpu[03-04]": ["gpu03", "gpu04"]}
    return job["job_state"] == "RUNNING" and node in nodes.get(job["nodes"], [job["nodes"]])


def rest_shape(job: dict[str, Any]) -> dict[str, Any]:
    """The same job as v0.0.40+ says it: numbers as objects, the state as a list."""

    def num(value: int | None) -> dict[str, Any]:
        return {"set": value is not None, "infinite": False, "number": value or 0}

    out = dict(job)
    out["job_state"] = [job["job_state"]]
    for key in ("array_job_id", "array_task_id", "het_job_id", "het_job_offset"):
        out[key] = num(job[key])
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(jobs=job_lists(), node=st.sampled_from(NODES))
def test_hostile_jobs_only_the_nodes_own_jobs_every_one_of_them(
    jobs: list[dict[str, Any]], node: str
) -> None:
    here = {str(j["job_id"]): j for j in jobs if on(j, node)}
    targets = {target(j) for j in here.values()}
    text = orjson.dumps({"jobs": jobs}).decode()  # squeue --json on 22.05
    for listing in (decode_json(text), convert({"jobs": [rest_shape(j) for j in jobs]})):
        found = running_on(listing, node)
        # Every job of the node is acted on, once (a hetjob's parts through one leader),
        # and nothing else: each found job is one of the node's own.
        assert {j.acted_on for j in found} == targets
        assert len(found) == len(targets)
        for job in found:
            assert job.node == node and job.job_id in here
            assert job.acted_on == target(here[job.job_id])
            for shown in (job.name, job.user):
                assert len(shown) <= SHOWN_LIMIT and shown.isprintable()


def target(job: dict[str, Any]) -> str:
    """What Slurm acts on for this job: a hetjob's leader, an array task as A_T."""
    if job["het_job_id"]:
        return str(job["het_job_id"])
    if job["array_task_id"] is not None:
        return f"{job['array_job_id']}_{job['array_task_id']}"
    return str(job["job_id"])


def test_hostile_jobs_the_attack_names_the_attackers_job_only() -> None:
    # The attack of the report: a job on gpu02 whose name, split on "|" and lines,
    # named two jobs of another user on gpu01.
    jobs = [
        {
            "job_id": 41,
            "name": "train",
            "user_name": "bob",
            "job_state": "RUNNING",
            "nodes": "gpu01",
        },
        {
            "job_id": 42,
            "name": "eval",
            "user_name": "bob",
            "job_state": "RUNNING",
            "nodes": "gpu01",
        },
        {
            "job_id": 43,
            "name": "x|y\n41|a|b\n42|c",
            "user_name": "mallory",
            "job_state": "RUNNING",
            "nodes": "gpu02",
        },
    ]
    (job,) = running_on(decode_json(orjson.dumps({"jobs": jobs})), "gpu02")
    assert (job.job_id, job.user) == ("43", "mallory")
    assert job.name == "x|y\\n41|a|b\\n42|c"  # shown escaped, never split


def test_hostile_jobs_arrays_and_heterogeneous_jobs_by_the_ids_slurm_acts_on() -> None:
    jobs = [
        {
            "job_id": 5,
            "array_job_id": 3,
            "array_task_id": 0,
            "job_state": "RUNNING",
            "nodes": "gpu03",
        },
        {
            "job_id": 6,
            "het_job_id": 6,
            "het_job_offset": 0,
            "job_state": "RUNNING",
            "nodes": "gpu04",
        },
        {
            "job_id": 7,
            "het_job_id": 6,
            "het_job_offset": 1,
            "job_state": "RUNNING",
            "nodes": "gpu03",
        },
    ]
    found = running_on(decode_json(orjson.dumps({"jobs": jobs})), "gpu03")
    assert [(j.job_id, j.shown, j.acted_on) for j in found] == [
        ("5", "3_0", "3_0"),
        ("7", "6+1", "6"),
    ]


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not json",
        '{"jobs": [{"job_id": 1, "job_state": "RUNNING", "nodes": "gpu02"}',  # cut
        '{"jobs": "x"}',
        '{"no_jobs": []}',
        '{"jobs": [{"job_state": "RUNNING", "nodes": "gpu02"}]}',
        '{"jobs": [{"job_id": "1;x", "job_state": "RUNNING", "nodes": "gpu02"}]}',
        '{"jobs": [{"job_id": 0, "job_state": "RUNNING", "nodes": "gpu02"}]}',
        '{"jobs": [{"job_id": 1, "job_state": "RUNNING", "nodes": "gpu[02"}]}',
    ],
)
def test_hostile_jobs_a_list_not_read_whole_is_an_error(text: str) -> None:
    with pytest.raises(JobListError):
        running_on(decode_json(text), "gpu02")
