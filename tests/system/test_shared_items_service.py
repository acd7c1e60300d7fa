"""Issue 52's shared items end to end: a model and its shadow (a near-copy: scores moved by at most
0.006) score the same 3,000 items in a review group with ``share_items``, served by two `stratameter
run` replicas, one killed with SIGKILL once requests are out.  The reviewer answers from the request
topic.  Each item is requested once for the pair: the member that asks first for an item publishes
its request, the other joins it and folds its answer; every answer is folded exactly once into each
classifier whose sample holds the item; both converge."""

from __future__ import annotations

import time

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from tests.harness import (RedisBackend, converged, new_workload, read_topic, stored_requests, summed,
                           two_replicas_through_a_kill)

pytestmark = pytest.mark.integration

PAIR = ("ranker", "ranker-shadow")
ITEMS = 3000


def scores(i: int) -> tuple[float, float]:
    """The model's score of item i and its shadow's, the same up to 0.006."""
    model = 0.5 + 0.5 * ((i * 7919) % 1000) / 1000
    return model, min(1.0, model + 0.002 * ((i * 31) % 7 - 3))


async def produce(work, producer: AIOKafkaProducer) -> None:
    now_ms = int(time.time() * 1000)
    for i in range(ITEMS):
        item = f"item#{i}"
        work.truth[item] = int(((i * 104729) % 1000) / 1000 < scores(i)[0])
        for cid, score in zip(PAIR, scores(i)):
            await producer.send(work.topics["scores"], key=cid.encode(), value=orjson.dumps(
                {"classifier_id": cid, "item_id": item, "score": score, "event_time": now_ms}))
    await producer.flush()


async def test_a_model_and_its_shadow_share_every_label_through_a_failover(kafka_bootstrap, redis_url, unique_name,
                                                                             tmp_path):
    work = await new_workload(kafka_bootstrap, RedisBackend(redis_url, False), unique_name, 4)
    config = tmp_path / "classifiers.json"
    config.write_bytes(orjson.dumps({"$review_groups": {"ranker": {"budget_per_hour": 100_000, "share_items": True}},
                                     **{cid: {"review_group": "ranker"} for cid in PAIR}}))
    settings = {"DELTA": "0.05", "CONFIDENCE": "0.95", "MAX_LABELS_PER_HOUR": "100000",
                "CLASSIFIERS_CONFIG_FILE": str(config)}
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=False, linger_ms=20)
    await producer.start()
    await produce(work, producer)
    docs = await two_replicas_through_a_kill(work, producer, settings, tmp_path, unique_name,
                                             lambda port: _requested(port, 30), _settled,
                                             "both converged, every answer folded")
    requests = await read_topic(kafka_bootstrap, work.topics["requests"], unique_name("count"), timeout=15)
    await producer.stop()
    by_id = {r["request_id"]: r for r in requests}  # the outbox may publish a request twice after a kill
    items = [r["item_id"] for r in by_id.values()]
    assert len(set(items)) == len(items), "an item requested twice for the pair"
    published = {cid: sum(r["classifier_id"] == cid for r in by_id.values()) for cid in PAIR}
    samples = {cid: docs[cid]["label_requests"] + docs[cid]["label_requests_joined"] for cid in PAIR}
    for cid in PAIR:
        assert docs[cid]["label_requests"] == published[cid], (cid, docs[cid]["label_requests"], published)
    # whichever member asks first for an item publishes its request; the other joins it
    joined = sum(docs[cid]["label_requests_joined"] for cid in PAIR)
    assert joined >= 0.8 * min(samples.values()), (joined, samples)
    # the pair's requests against the larger sample, each classifier's requests alone
    assert len(items) <= 1.05 * max(samples.values()), (len(items), samples)
    # every answer folded exactly once into each classifier whose sample holds the item
    stored = await _requests_stored(work)
    for cid in PAIR:
        own = [label for rid, label in work.answered.items() if rid.startswith(f"{cid}/")]
        joins = [h for h in stored[cid].values() if "joins" in h]
        for h in joins:
            if h["state"] in ("answered", "skipped"):
                first = work.answered[h["joins"]]
                assert h.get("label") == (None if first is None else str(int(first))), h
        shared = sum(h["state"] == "answered" for h in joins)
        got = docs[cid]["labels_by_outcome"]
        assert got["accepted"] == sum(label is not None for label in own) + shared, (cid, got, shared)
        assert docs[cid]["labels"] == got["accepted"] == sum(s["labels"] for s in docs[cid]["strata"])


async def _requests_stored(work) -> dict[str, dict[str, dict]]:
    """Each classifier's request records straight from Redis once every replica has stopped."""
    from stratameter.state.keys import Keys

    keys, redis = Keys(work.prefix), RedisBackend(work.redis_url, False).client()
    try:
        return {cid: await stored_requests(redis, keys, cid) for cid in PAIR}
    finally:
        await redis.aclose()


async def _requested(port: int, n: int) -> bool:
    """At least `n` requests out for the pair (whichever member asks first for an item publishes it)."""
    return await summed(port, PAIR, lambda doc: doc["label_requests"] + doc["label_requests_joined"]) >= n


async def _settled(port: int) -> dict | None:
    """Both documents once both have converged with nothing pending; None before."""
    docs = await converged(port, PAIR)
    if docs is None or any(doc["pending"] for doc in docs.values()):
        return None
    return docs
