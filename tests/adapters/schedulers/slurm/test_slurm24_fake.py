"""The fake slurmrestd and rackguard's error mapping, held to what a real Slurm 24.11 sent.

No server of Slurm's here: the answers recorded from the real 24.11 slurmrestd
(tests/fixtures/slurm24, kept current by test_slurm24_rest.py) are the reference.
The fake must answer every exchange with the same status and shape; each recorded
error body, served as is, must become the outcome rackguard promises for it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from adapters.base import DeliveryError
from adapters.schedulers.jobs import NoticeTerms, Outcome
from adapters.schedulers.slurm.auth import JwtToken
from adapters.schedulers.slurm.client import SlurmClient
from adapters.schedulers.slurm.jobs import SlurmJobs
from adapters.schedulers.slurm.rest_jobs import SlurmRestJobs
from adapters.schedulers.slurm.sink import SlurmSink
from fakes.slurmrestd import FakeSlurmrestd
from policies.model import Action
from tests.support.slurm import decision
from tests.support.slurm24 import VERSIONS
from tests.support.slurm24_exchanges import Answer, answer_problems, play, recording

USR1 = NoticeTerms("USR1", 0.0, "rackguard: test", "gpu")


@pytest.fixture
async def fake24() -> AsyncIterator[FakeSlurmrestd]:
    server = FakeSlurmrestd(tokens={"root": "token-root", "nobody": "token-nobody"})
    await server.start()
    yield server
    await server.stop()


@pytest.mark.parametrize("version", VERSIONS)
async def test_slurm24_the_fake_answers_as_the_real_server_did(
    fake24: FakeSlurmrestd, version: str
) -> None:
    answers = await play(fake24.url, fake24.tokens, version)
    recorded = recording(version)
    problems = {n: p for n, a in answers.items() if (p := answer_problems(recorded[n], a))}
    assert problems == {}


def _serve(fake: FakeSlurmrestd, answer: Answer, method: str = "") -> None:
    """The fake answers the next request (of ``method``) with a recorded answer, as is."""
    fake.fail_next, fake.fail_status, fake.fail_method = 1, answer.status, method
    fake.fail_body = answer.body if isinstance(answer.body, dict) else None


@pytest.fixture
async def sink(fake24: FakeSlurmrestd, tmp_path: Path) -> AsyncIterator[SlurmSink]:
    token = tmp_path / "jwt"
    token.write_text("token-root\n")
    token.chmod(0o600)
    s = SlurmSink(SlurmClient(fake24.url, token=JwtToken(token), timeout_s=5.0))
    await s.client.job_api()  # the version is known: the next request is the one served
    yield s
    await s.close()


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    ("name", "node", "reason", "says"),
    [
        ("drain_unknown", "gpu99", "not_found", "does not know this node"),
        ("drain_not_admin", "gpu04", "auth", "not a Slurm administrator"),
        ("state_unknown", "gpu04", "refused", "Slurm error"),  # 9207, then 2028 on 41+
    ],
)
async def test_slurm24_recorded_refusals_are_permanent(
    fake24: FakeSlurmrestd,
    sink: SlurmSink,
    version: str,
    name: str,
    node: str,
    reason: str,
    says: str,
) -> None:
    _serve(fake24, recording(version)[name])
    with pytest.raises(DeliveryError) as err:
        await sink.deliver(decision(node, Action.DRAIN))
    assert err.value.permanent and err.value.reason == reason and says in str(err.value)


@pytest.mark.parametrize("version", VERSIONS)
async def test_slurm24_a_recorded_unknown_node_read_is_no_node(
    fake24: FakeSlurmrestd, sink: SlurmSink, version: str
) -> None:
    _serve(fake24, recording(version)["node_unknown"])
    assert (await sink.read_state(["gpu99"]))["gpu99"].exists is False


@pytest.mark.parametrize("version", VERSIONS)
async def test_slurm24_a_recorded_token_refusal_is_refreshed_then_permanent(
    fake24: FakeSlurmrestd, sink: SlurmSink, version: str
) -> None:
    answer = recording(version)["bad_token"]
    assert answer.status == 511
    fake24.fail_next, fake24.fail_status, fake24.fail_body = 2, 511, answer.body
    with pytest.raises(DeliveryError) as err:
        await sink.deliver(decision("gpu01", Action.DRAIN))
    assert err.value.permanent and err.value.reason == "auth"


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    "name", ["signal_unknown_job", "signal_federation_job", "signal_name_unknown"]
)
async def test_slurm24_recorded_signal_answers_become_outcomes(
    fake24: FakeSlurmrestd,
    sink: SlurmSink,
    version: str,
    name: str,
) -> None:
    jobs = SlurmRestJobs(sink.client, SlurmJobs(sink.client))
    fake24.add_job("gpu01", job_id=41)
    (job,) = await jobs.running("gpu01")  # confirmed on its node before the signal
    answer = recording(version)[name]
    _serve(fake24, answer, "DELETE")
    if name == "signal_name_unknown" and answer.status == 500:
        # v0.0.40: HTTP 500, error 22: a server error, retried (the config refuses the name).
        with pytest.raises(Exception, match="22"):
            await jobs.notify(job, USR1)
        return
    got, said = await jobs.notify(job, USR1)  # the answer is served as recorded
    expected = {
        # v0.0.40/41 answer a gone job 200 with no errors: rackguard cannot tell it.
        "signal_unknown_job": Outcome.GONE if version == "v0.0.42" else Outcome.DONE,
        "signal_federation_job": Outcome.GONE,  # 404 + 2017 at every version
        "signal_name_unknown": Outcome.REFUSED,  # 200 with error 0: never "told"
    }[name]
    assert got is expected, said


async def test_slurm24_het_components_and_array_tasks_are_named_as_slurm_needs(
    fake24: FakeSlurmrestd, sink: SlurmSink
) -> None:
    """As measured on 24.11: a het job by its leader (a signal to another component
    reaches nobody), an array task as ARRAY_TASK (by the array's id: every task)."""
    leader = fake24.add_job("gpu01", name="het", job_id=40)
    other = fake24.add_job("gpu02", name="het", job_id=41)
    fake24.jobs[leader].het_job_id = fake24.jobs[other].het_job_id = 40
    fake24.jobs[other].het_job_offset = 1
    first = fake24.add_job("gpu02", name="arr", job_id=52)  # runs under the array's id
    second = fake24.add_job("gpu02", name="arr", job_id=53)
    fake24.jobs[first].array_job_id = fake24.jobs[second].array_job_id = 52
    fake24.jobs[first].array_task_id, fake24.jobs[second].array_task_id = 1, 0
    fake24.jobs[second].het_job_id = 0
    garbage = fake24.add_job("gpu02", name="bad", job_id=60)
    fake24.jobs[garbage].array_job_id, fake24.jobs[garbage].array_task_id = 60, -5
    jobs = SlurmRestJobs(sink.client, SlurmJobs(sink.client))
    assert [j.acted_on for j in await jobs.running("gpu01")] == ["40"]
    listed = await jobs.running("gpu02")
    on2 = [(j.job_id, j.acted_on, j.name) for j in listed]
    assert on2 == [
        ("41", "40", "het"),
        ("52", "52_1", "arr"),
        ("53", "52_0", "arr"),
        ("60", "60", "bad"),
    ]
    assert (await jobs.notify(listed[1], USR1))[0] is Outcome.DONE
    assert ("DELETE", "/slurm/v0.0.42/job/52_1") in fake24.requests
