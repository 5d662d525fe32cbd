"""The persisted and sent forms of a decision: rows of the old outbox decode, payloads unchanged."""

from __future__ import annotations

import dataclasses

import orjson

from adapters.schedulers.decision_json import decision_to_dict
from adapters.schedulers.webhook.sink import WebhookSink
from daemon.delivery.outbox import _encode, decision_from_dict
from policies.model import Action, Assessment, Condition, Decision, FaultDomain

A = Assessment("gpu3", FaultDomain.GPU, Condition.WARNING, 5.0, 72.0, "celsius", 90.0, 2.8, 360.0,
               "72C, falling")  # fmt: skip
B = Assessment("rack-1", FaultDomain.RACK, Condition.UNKNOWN, 5.5)
DECISION = Decision("n2", Action.DRAIN, "rackguard: gpu3 72C", FaultDomain.GPU, 1767225600.25,
                    "rg-abc", (A, B), True)  # fmt: skip

# Written by the hand-made codecs before the model's codec replaced them.
OLD_ROW = (
    b'{"node":"n2","action":"drain","reason":"rackguard: gpu3 72C","domain":"gpu",'
    b'"at":1767225600.25,"key":"rg-abc","dry_run":true,"evidence":[{"subject":"gpu3",'
    b'"domain":"gpu","condition":"warning","value":72.0,"unit":"celsius","threshold":90.0,'
    b'"trend_per_min":2.8,"time_to_threshold_s":360.0,"detail":"72C, falling","at":5.0},'
    b'{"subject":"rack-1","domain":"rack","condition":"unknown","value":null,"unit":"",'
    b'"threshold":null,"trend_per_min":null,"time_to_threshold_s":null,"detail":"","at":5.5}]}'
)
OLD_PAYLOAD = (
    b'{"node":"n2","action":"drain","reason":"rackguard: gpu3 72C","domain":"gpu",'
    b'"at":1767225600.25,"key":"rg-abc","dry_run":true,"evidence":[{"subject":"gpu3",'
    b'"domain":"gpu","condition":"warning","value":72.0,"unit":"celsius","threshold":90.0,'
    b'"trend_per_min":2.8,"time_to_threshold_s":360.0,"detail":"72C, falling"},'
    b'{"subject":"rack-1","domain":"rack","condition":"unknown","value":null,"unit":"",'
    b'"threshold":null,"trend_per_min":null,"time_to_threshold_s":null,"detail":""}]}'
)


def test_an_outbox_row_of_the_old_code_decodes() -> None:
    assert decision_from_dict(orjson.loads(OLD_ROW)) == DECISION


def test_an_outbox_row_from_before_assessment_times_takes_the_decisions_time() -> None:
    row = orjson.loads(OLD_PAYLOAD)  # the wire shape: no assessment times
    decoded = decision_from_dict(row)
    assert [a.at for a in decoded.evidence] == [DECISION.at, DECISION.at]
    assert decoded.evidence[0].detail == "72C, falling"


def test_a_new_outbox_row_decodes_and_keeps_every_field() -> None:
    body = _encode(DECISION)
    assert decision_from_dict(orjson.loads(body)) == DECISION
    assert orjson.loads(body) == orjson.loads(OLD_ROW)  # the same data, maybe in another order


def test_the_webhook_and_api_payload_is_unchanged_byte_for_byte() -> None:
    assert orjson.dumps(decision_to_dict(DECISION)) == OLD_PAYLOAD


def test_the_webhook_payload_is_the_old_one_plus_its_deadline_last() -> None:
    sink = WebhookSink("http://127.0.0.1:9/", b"k", grace_s=(540.0, 20.0))
    body = orjson.dumps(sink.payload(DECISION))
    # Every byte a receiver parsed before, then the new key: 1767225600.25 + 540 s.
    assert body == OLD_PAYLOAD[:-1] + b',"checkpoint_by":"2026-01-01T00:09:00Z"}'
    resume = dataclasses.replace(DECISION, action=Action.RESUME)
    assert orjson.loads(orjson.dumps(sink.payload(resume)))["checkpoint_by"] is None
