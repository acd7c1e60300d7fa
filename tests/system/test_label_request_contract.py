"""The label-request contract is what production publishes: records taken off the
topic the running service writes to, checked against `stratameter.schemas.messages.LabelRequest`
(millisecond RFC 3339 UTC timestamps included)."""

from __future__ import annotations

import re
import time

import orjson
import pytest

from stratameter.embedded import group_consumer
from stratameter.schemas.messages import LabelRequest
from tests.harness import Reviewer, running_service, wait_for

pytestmark = pytest.mark.integration

MS_UTC = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")


def test_label_request_rejects_timestamps_without_milliseconds():
    good = {"request_id": "c/t", "classifier_id": "c", "item_id": "i", "score": 0.5, "stratum": 0,
            "requested_at": "2026-11-23T08:13:20.000Z", "expires_at": "2026-11-24T08:13:20.123Z", "context": None}
    LabelRequest.model_validate(good)
    for bad in ("2026-11-23T08:13:20Z", "2026-11-23T08:13:20.123000Z", "2026-11-23T08:13:20.000+00:00"):
        with pytest.raises(ValueError):
            LabelRequest.model_validate({**good, "requested_at": bad})


async def published_requests(run, unique_name, at_least: int) -> list[tuple[bytes, bytes]]:
    """(key, value) of the first `at_least` or more label requests the running service publishes,
    read off its requests topic while a reviewer answers every one (so the loop keeps asking)."""
    raw: list[tuple[bytes, bytes]] = []
    async with group_consumer(run.topics["requests"], bootstrap_servers=run.bootstrap,
                              group_id=unique_name("requests")) as consumer:
        async with Reviewer(run, unique_name("rev"), lambda req: True):

            async def some():
                batch = await consumer.getmany(timeout_ms=500)
                raw.extend((r.key, r.value) for recs in batch.values() for r in recs)
                return len(raw) >= at_least

            await wait_for(some, 120, "label requests on the topic")
    return raw


async def test_published_label_requests_follow_the_documented_contract(kafka_bootstrap, redis_url, unique_name):
    async with running_service(kafka_bootstrap, redis_url, unique_name, DELTA="0.1") as run:
        now_ms = int(time.time() * 1000)
        for i in range(200):
            await run.send_score(classifier_id="contract", item_id=f"i{i}", score=0.5 + i / 400, event_time=now_ms,
                                 context={"text": f"item {i}", "n": i})
        await run.producer.flush()
        raw = await published_requests(run, unique_name, 8)
    for key, value in raw:
        req = LabelRequest.model_validate_json(value)
        assert key == b"contract"
        assert MS_UTC.match(req.requested_at) and MS_UTC.match(req.expires_at), value
        assert req.request_id.startswith("contract/")
        assert req.context == {"text": f"item {req.item_id[1:]}", "n": int(req.item_id[1:])}
        assert orjson.loads(value)["score"] == req.score


async def test_label_requests_carry_item_ids_as_sent_whatever_their_characters(kafka_bootstrap, redis_url,
                                                                              unique_name):
    """Item ids are any text: ids ending in a quote and a comma (JSON ``"a\\","``, which reads as
    the separator of a list of ids), backslashes, quotes, line separators.  Every label request
    names an item as it was sent, with its own score and context."""
    shapes = ['{}",', '",{}', '{}\\', '"{}"', '{}\\",', '{}\u2028', 'é{},"']
    sent = {}
    async with running_service(kafka_bootstrap, redis_url, unique_name, DELTA="0.1") as run:
        now_ms = int(time.time() * 1000)
        for i in range(210):
            item = shapes[i % len(shapes)].format(i)
            sent[item] = (0.5 + i / 440, {"n": i})
            await run.send_score(classifier_id="ids", item_id=item, score=sent[item][0], event_time=now_ms,
                                 context=sent[item][1])
        await run.producer.flush()
        raw = await published_requests(run, unique_name, 20)
    for _, value in raw:
        req = LabelRequest.model_validate_json(value)
        assert req.item_id in sent, value
        assert (req.score, req.context) == sent[req.item_id], value
