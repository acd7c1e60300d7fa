"""End to end against a real Kafka-protocol broker and a real Redis: scores in,
label requests out, a simulated reviewer answering from ground truth, labels
in, estimates out on the JSON API and /metrics."""

from __future__ import annotations

import re
import time
from pathlib import Path

import orjson
import pytest

from stratameter.simulate.populations import builtin
from tests.harness import Reviewer, running_service, wait_for

pytestmark = pytest.mark.integration

ITEMS = 3000
HTTP_API = Path(__file__).resolve().parents[2] / "docs" / "reference" / "http-api.md"


async def test_full_loop_converges_for_several_classifiers(kafka_bootstrap, redis_backend, unique_name):
    settings = {"DELTA": "0.05", "CONFIDENCE": "0.999", "MAX_LABELS_PER_HOUR": "5000"}
    async with running_service(kafka_bootstrap, redis_backend.url, unique_name, **redis_backend.settings,
                               **settings) as run:
        truth_by_item: dict[str, int] = {}
        truth: dict[str, float] = {}
        now_ms = int(time.time() * 1000)
        for cid, pop_name in (("spam-v1", "calibrated"), ("fraud.v2", "svm-margin")):
            pop = builtin(pop_name, size=ITEMS)
            truth[cid] = pop.truth
            for i, (s, y) in enumerate(zip(pop.scores, pop.labels)):
                truth_by_item[f"{cid}-{i}"] = int(y)
                await run.send_score(classifier_id=cid, item_id=f"{cid}-{i}", score=float(s), predicted_positive=True,
                                     event_time=now_ms, context={"n": i})
        await run.producer.send(run.topics["scores"], key=b"x", value=b"{not json")
        await run.producer.send(run.topics["scores"], key=b"x", value=b'{"classifier_id":"a","item_id":"b","score":"0.9"}')
        await run.send_label("spam-v1/forged-token", True)  # a forged id names no outstanding request
        answered = []

        def answer(req):
            answered.append(req["request_id"])
            if len(answered) % 50 == 3:  # answered twice: the second is a duplicate, never folded
                return False
            return None if len(answered) % 17 == 5 else bool(truth_by_item[req["item_id"]])

        async def duplicate_then(req):
            label = answer(req)
            if len(answered) % 50 == 3:
                await run.send_label(req["request_id"], bool(truth_by_item[req["item_id"]]))
            return label

        async def converged():
            docs = {}
            for cid in truth:
                status, body = await run.get(f"/v1/classifiers/{cid}")
                if status != 200 or orjson.loads(body)["status"] != "converged":
                    return None
                docs[cid] = orjson.loads(body)
            return docs

        async with Reviewer(run, unique_name("rev"), duplicate_then):
            docs = await wait_for(converged, 90, "both classifiers to converge")
        for cid, doc in docs.items():
            assert doc["scores"] == ITEMS
            assert doc["population"] == ITEMS
            assert doc["ci_lower"] <= truth[cid] <= doc["ci_upper"], (cid, truth[cid], doc)
            assert doc["ci_upper"] - doc["ci_lower"] <= 2 * 0.05 + 1e-9
            assert doc["labels"] == sum(s["labels"] for s in doc["strata"]) > 0
            assert doc["labels_by_outcome"]["accepted"] == doc["labels"]
            assert doc["labels_by_outcome"]["skipped"] > 0
        # the HTTP API page (docs/reference/http-api.md) names every field the API returns (the classifier's, a stratum's, a chunk's in history)
        api_row = next(line for line in HTTP_API.read_text().splitlines() if line.startswith("| `/v1/classifiers/{id}`"))
        named = set(re.findall(r"`([a-z_]+)`", api_row))
        for doc in docs.values():
            fields = set(doc) | set(doc["strata"][0]) | {k for chunk in doc["history"] for k in chunk}
            assert fields <= named, sorted(fields - named)
        status, body = await run.get("/metrics")
        text = body.decode()
        assert status == 200
        assert 'stratameter_precision_ratio{classifier="spam-v1"}' in text
        assert 'stratameter_scores_total{classifier="fraud.v2"} 3000.0' in text
        assert 'stratameter_labels_total{classifier="",outcome="unknown"} 1.0' in text
        assert f'stratameter_invalid_messages_total{{reason="invalid_json",topic="{run.topics["scores"]}"}} 1.0' in text
        status, body = await run.get("/v1/classifiers")
        assert sorted(orjson.loads(body)) == ["fraud.v2", "spam-v1"]
        assert (await run.get("/readyz"))[0] == 200
        assert (await run.get("/v1/classifiers/nope"))[0] == 404
        assert (await run.get("/v1/classifiers/bad%20id"))[0] == 400
