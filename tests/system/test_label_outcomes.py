"""Label outcomes through the real service: expired requests are replaced in
their stratum and late answers are not folded; a label naming another
classifier's request, or no classifier at all, is unknown; duplicates count once."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest

from tests.harness import Reviewer, running_service, wait_for

pytestmark = pytest.mark.integration


async def test_expired_requests_are_replaced_and_late_answers_not_folded(kafka_bootstrap, redis_backend, unique_name):
    settings = {"LABEL_TIMEOUT_SECONDS": "1.5", "DELTA": "0.2", "CONFIDENCE": "0.9", "STRATA": "2"}
    async with running_service(kafka_bootstrap, redis_backend.url, unique_name, **redis_backend.settings,
                               **settings) as run:
        now_ms = int(time.time() * 1000)
        for i in range(400):
            await run.send_score(classifier_id="clf", item_id=f"i{i}", score=0.5 + i / 800, event_time=now_ms)
        late: list[str] = []

        def answer(req):
            if len(late) < 4:  # the whole first round (2 strata x 2 labels) is answered too late
                late.append(req["request_id"])
                return ...
            return True

        async with Reviewer(run, unique_name("rev"), answer) as reviewer:
            async def expired():
                _, body = await run.get("/v1/classifiers/clf")
                return orjson.loads(body)["requests_expired"] >= 4
            await wait_for(expired, 30, "the first round to expire")
            for rid in late:  # the reviewer finally answers: too late
                await run.send_label(rid, False)

            async def done():
                _, body = await run.get("/v1/classifiers/clf")
                doc = orjson.loads(body)
                # settled: converged with nothing pending, so no label is folded between the view's
                # read of the counters and its read of the chunk (the two are not one snapshot)
                settled = doc["status"] == "converged" and doc["pending"] == 0
                return doc if settled and doc["labels_by_outcome"]["expired"] == 4 and doc["labels"] >= 4 else None
            doc = await wait_for(done, 60, "replacements answered, late answers counted, the chunk converged")
        assert doc["labels_by_outcome"]["expired"] == 4
        assert doc["labels_by_outcome"]["accepted"] == doc["labels"]
        assert all(s["positives"] == s["labels"] for s in doc["strata"])  # the late False answers were not folded
        assert doc["label_requests"] >= 8  # the 4 expired ones were replaced
        _, body = await run.get("/metrics")
        assert f'stratameter_label_requests_expired_total{{classifier="clf"}} {float(doc["requests_expired"])}' \
            in body.decode()
        items = [r["item_id"] for r in reviewer.requests]
        assert len(items) == len(set(items)), "an item was requested twice"
        per_stratum = {}
        for r in reviewer.requests:
            per_stratum[r["stratum"]] = per_stratum.get(r["stratum"], 0) + 1
        assert set(per_stratum) == {0, 1}


async def test_foreign_unknown_and_duplicate_labels(kafka_bootstrap, redis_backend, unique_name):
    settings = {"DELTA": "0.3", "CONFIDENCE": "0.8", "STRATA": "1"}
    async with running_service(kafka_bootstrap, redis_backend.url, unique_name, **redis_backend.settings,
                               **settings) as run:
        now_ms = int(time.time() * 1000)
        for cid in ("a", "b"):
            for i in range(50):
                await run.send_score(classifier_id=cid, item_id=f"{cid}{i}", score=0.9, event_time=now_ms)
        got: list[dict] = []
        async with Reviewer(run, unique_name("rev"), lambda req: (got.append(req), ...)[1]):
            await wait_for(lambda: asyncio.sleep(0, result=len({r["classifier_id"] for r in got}) == 2), 30,
                           "requests for both classifiers")
        a_req = next(r for r in got if r["classifier_id"] == "a")
        token = a_req["request_id"].split("/", 1)[1]
        await run.send_label(f"b/{token}", True)  # a's token under b's name: unknown, never folded into b
        await run.send_label("no-classifier-here", True)
        await run.send_label("not a classifier/token", True)  # a prefix that is no valid classifier id
        for ghost in ("ghost-00001/t1", "ghost-00002/t2", "ghost-00001/t3", "a~negatives/t4"):
            await run.send_label(ghost, True)  # made-up classifiers (and a state never created): no key, unknown
        await run.send_label(a_req["request_id"], True)
        await run.send_label(a_req["request_id"], False)  # duplicate: the first answer stands
        await run.producer.send(run.topics["labels"], value=b'{"request_id": "a/x"}')  # label missing: invalid

        async def settled():
            _, body = await run.get("/metrics")
            text = body.decode()
            return text if 'outcome="duplicate"} 1.0' in text and 'outcome="unknown"} 7.0' in text else None
        text = await wait_for(settled, 30, "label outcomes")
        assert 'stratameter_labels_total{classifier="a",outcome="accepted"} 1.0' in text
        assert 'stratameter_labels_total{classifier="b",outcome="accepted"} 0.0' in text
        # every unknown answer in one series: b's, 2 unroutable and 4 made up (before: the made-up ones
        # were counted in hashes of classifiers that do not exist, and exported nowhere)
        assert 'stratameter_labels_total{classifier="",outcome="unknown"} 7.0' in text
        redis = redis_backend.client()
        try:
            prefix = run.service.settings.redis_key_prefix
            assert [k async for k in redis.scan_iter(f"{prefix}:{{ghost*")] == []
            assert [k async for k in redis.scan_iter(f"{prefix}:{{a}}:neg:*")] == []
        finally:
            await redis.aclose()
        assert 'stratameter_invalid_messages_total{reason="missing_field:label"' in text
        _, body = await run.get("/v1/classifiers/a")
        doc = orjson.loads(body)
        assert doc["labels"] == 1 and sum(s["positives"] for s in doc["strata"]) == 1
