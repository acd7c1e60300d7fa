"""End to end against a real Kafka-protocol broker and a real Redis: scores in,
label requests out, a simulated reviewer answering from ground truth, labels
in, estimates out on the JSON API and /metrics."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from service.config import load_settings
from service.embedded import create_topics, find_free_port, leave_group_on_stop
from service.simulate.populations import builtin

pytestmark = pytest.mark.integration

ITEMS = 3000


async def _http_get(port: int, path: str) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    raw = await reader.read()
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


async def test_full_loop_converges_for_several_classifiers(kafka_bootstrap, redis_url, unique_name):
    from service.app.runner import Service
    from service.api.http import serve

    topics = {name: unique_name(name) for name in ("scores", "requests", "labels", "dlq")}
    await create_topics(kafka_bootstrap, list(topics.values()), partitions=3)
    port = find_free_port()
    settings = load_settings({
        "STRATAMETER_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "STRATAMETER_KAFKA_CONSUMER_GROUP": unique_name("group"),
        "STRATAMETER_REDIS_URL": redis_url,
        "STRATAMETER_REDIS_KEY_PREFIX": unique_name("sm"),
        "STRATAMETER_TOPIC_SCORES": topics["scores"],
        "STRATAMETER_TOPIC_LABEL_REQUESTS": topics["requests"],
        "STRATAMETER_TOPIC_LABELS": topics["labels"],
        "STRATAMETER_TOPIC_DEAD_LETTER": topics["dlq"],
        "STRATAMETER_HTTP_PORT": str(port),
        "STRATAMETER_DELTA": "0.05",
        "STRATAMETER_CONFIDENCE": "0.999",
        "STRATAMETER_MAX_LABELS_PER_HOUR": "5000",
        "STRATAMETER_KAFKA_SESSION_TIMEOUT_MS": "6000",
    })
    truth_by_item: dict[str, int] = {}
    truth: dict[str, float] = {}
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=False)
    await producer.start()
    now_ms = int(time.time() * 1000)
    for cid, pop_name in (("spam-v1", "calibrated"), ("fraud.v2", "svm-margin")):
        pop = builtin(pop_name, size=ITEMS)
        truth[cid] = pop.truth
        for i, (s, y) in enumerate(zip(pop.scores, pop.labels)):
            item = f"{cid}-{i}"
            truth_by_item[item] = int(y)
            await producer.send(topics["scores"], key=cid.encode(), value=orjson.dumps({
                "classifier_id": cid, "item_id": item, "score": float(s), "predicted_positive": True,
                "event_time": now_ms, "context": {"n": i}}))
    await producer.send(topics["scores"], key=b"x", value=b"{not json")
    await producer.send(topics["scores"], key=b"x", value=b'{"classifier_id":"a","item_id":"b","score":"0.9"}')
    await producer.flush()

    service = Service(settings)
    server = await serve(service, "127.0.0.1", port)
    await service.start()
    tasks = [asyncio.create_task(service.consume_forever()), asyncio.create_task(service.requests_forever())]

    reviewer = AIOKafkaConsumer(topics["requests"], bootstrap_servers=kafka_bootstrap, group_id=unique_name("rev"),
                                auto_offset_reset="earliest", session_timeout_ms=6000, heartbeat_interval_ms=500)
    await reviewer.start()
    leave_group_on_stop(reviewer)
    answered = 0

    async def review() -> None:
        nonlocal answered
        async for rec in reviewer:
            req = orjson.loads(rec.value)
            label = None if answered % 17 == 5 else bool(truth_by_item[req["item_id"]])  # some skips
            await producer.send(topics["labels"], key=b"any", value=orjson.dumps(
                {"request_id": req["request_id"], "label": label, "labeler_id": "bot"}))
            if answered % 50 == 3:  # a duplicate answer must not count twice
                await producer.send(topics["labels"], value=orjson.dumps({"request_id": req["request_id"], "label": False}))
            answered += 1

    review_task = asyncio.create_task(review())
    await producer.send(topics["labels"], value=orjson.dumps({"request_id": "spam-v1/forged", "label": True}))
    try:
        deadline = time.time() + 90
        docs = {}
        while time.time() < deadline:
            await asyncio.sleep(1)
            docs = {}
            for cid in truth:
                status, body = await _http_get(port, f"/v1/classifiers/{cid}")
                if status == 200:
                    docs[cid] = orjson.loads(body)
            if len(docs) == 2 and all(d["status"] == "converged" for d in docs.values()):
                break
        assert len(docs) == 2, docs
        for cid, doc in docs.items():
            assert doc["status"] == "converged", doc
            assert doc["scores"] == ITEMS
            assert doc["population"] == ITEMS
            assert doc["ci_lower"] <= truth[cid] <= doc["ci_upper"], (cid, truth[cid], doc)
            assert doc["ci_upper"] - doc["ci_lower"] <= 2 * 0.05 + 1e-9
            assert doc["labels"] == sum(s["labels"] for s in doc["strata"]) > 0
            assert doc["labels_by_outcome"]["accepted"] == doc["labels"]
        status, body = await _http_get(port, "/metrics")
        text = body.decode()
        assert status == 200
        assert 'stratameter_precision_ratio{classifier="spam-v1"}' in text
        assert 'stratameter_scores_total{classifier="fraud.v2"} 3000.0' in text
        assert 'stratameter_labels_total{classifier="",outcome="unknown"} 1.0' in text
        assert f'stratameter_invalid_messages_total{{reason="invalid_json",topic="{topics["scores"]}"}} 1.0' in text
        status, body = await _http_get(port, "/v1/classifiers")
        assert sorted(orjson.loads(body)) == ["fraud.v2", "spam-v1"]
        assert (await _http_get(port, "/readyz"))[0] == 200
    finally:
        review_task.cancel()
        service.stopping.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        server.close()
        await service.stop()
        await reviewer.stop()
        await producer.stop()
