"""Issue 52 end to end: six classifiers share one review budget (``REVIEW_BUDGET_PER_HOUR``) served
by two `stratameter run` replicas, one killed with SIGKILL mid-hour.  The group's requests, counted
from the request topic, never exceed the budget paced so far; nothing is lost or counted twice;
a classifier the budget cannot bring to its delta says ``waiting_for_budget``.  (How the budget is
split is `tests/integration/test_group_grants.py`'s: here the replicas start mid-hour, so the paced
allowance of the hour so far goes at once, first come first served by rounds, to the classifiers
whose scores the replicas read first.)"""

from __future__ import annotations

import math
import time
from collections import Counter
from datetime import datetime

import pytest
from aiokafka import AIOKafkaProducer

from stratameter.chunks.lifecycle import budget_allowance
from tests.harness import RedisBackend, http_json, new_workload, read_topic, summed, two_replicas_through_a_kill

pytestmark = pytest.mark.integration

CLASSIFIERS = tuple(f"team-{i}" for i in range(6))
PER_CLASSIFIER = 4000
#: The budget's paced allowance when the test starts: far below the ~4,000 labels the six need
#: together to reach delta 0.02, so the shared budget binds.
ALLOWANCE_AT_START = 240


def hourly_budget(now_s: float) -> int:
    """The hourly budget whose paced allowance is `ALLOWANCE_AT_START` now (`budget_allowance`)."""
    share = 0.1 + 0.9 * (int(now_s) % 3600) / 3600
    return math.ceil(ALLOWANCE_AT_START / share)


async def test_two_replicas_share_one_budget_through_a_failover(kafka_bootstrap, redis_url, unique_name, tmp_path):
    work = await new_workload(kafka_bootstrap, RedisBackend(redis_url, False), unique_name, 6)
    budget = hourly_budget(time.time())
    settings = {"DELTA": "0.02", "CONFIDENCE": "0.95", "MAX_LABELS_PER_HOUR": "100000",
                "REVIEW_BUDGET_PER_HOUR": str(budget)}
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=False, linger_ms=20)
    await producer.start()
    # every classifier's scores are there when the replicas start: each joins the group at once
    await work.produce(producer, CLASSIFIERS, PER_CLASSIFIER)
    docs = await two_replicas_through_a_kill(work, producer, settings, tmp_path, unique_name,
                                             lambda port: _requested_at_least(port, 60),
                                             lambda port: _settled(port, work),
                                             "the budget spent and every answer folded")
    requests = await read_topic(kafka_bootstrap, work.topics["requests"], unique_name("count"), timeout=15)
    await producer.stop()
    work.assert_exact(docs, PER_CLASSIFIER)
    issued, granted = await _recorded(work, {int(r["requested_at_s"]) // 3600 for r in _timed(requests)})
    by_id = {r["request_id"]: r for r in _timed(requests)}  # the outbox may publish a request twice after a kill
    assert len(by_id) == sum(issued.values()), (len(by_id), issued)  # exactly what the states recorded
    hours = Counter(int(r["requested_at_s"]) // 3600 for r in by_id.values())
    newest = max(r["requested_at_s"] for r in by_id.values())
    for hour, count in hours.items():
        paced = budget if hour < newest // 3600 else int(budget_allowance(budget, int(newest) % 3600))
        assert count <= granted[hour] <= paced, (hour, count, granted[hour], paced)


def _timed(requests: list[dict]) -> list[dict]:
    return [{**r, "requested_at_s": datetime.fromisoformat(r["requested_at"]).timestamp()} for r in requests]


async def _recorded(work, hours: set[int]) -> tuple[dict[str, int], dict[int, int]]:
    """Straight from Redis once every replica has stopped: each classifier's requests recorded
    (ISSUE), and the group's grants per clock hour (GRANT)."""
    from stratameter.state.keys import Keys

    keys, redis = Keys(work.prefix), RedisBackend(work.redis_url, False).client()
    try:
        issued = {cid: int(await redis.hget(keys.counters(cid), "requests_total") or 0) for cid in CLASSIFIERS}
        granted = {h: int(await redis.get(keys.group_granted("default", h)) or 0) for h in hours}
    finally:
        await redis.aclose()
    return issued, granted


async def _requested_at_least(port: int, n: int) -> bool:
    return await summed(port, CLASSIFIERS, lambda doc: doc["label_requests"]) >= n


async def _settled(port: int, work) -> dict | None:
    """Every classifier's document once the group's budget is spent (nothing left now), each
    classifier's loop has said so (``waiting_for_budget``), nothing is pending and every answer
    given is folded; None before."""
    docs = {}
    for cid in CLASSIFIERS:
        status, doc = await http_json(port, f"/v1/classifiers/{cid}")
        if status != 200 or doc["pending"] or doc["scores"] < PER_CLASSIFIER or doc["status"] != "waiting_for_budget":
            return None
        docs[cid] = doc
    status, group = await http_json(port, "/v1/review-groups/default")
    if status != 200 or group["remaining"] > 3:  # the paced allowance grows by a label every few seconds
        return None
    answered = sum(label is not None for label in work.answered.values())
    if sum(d["labels_by_outcome"]["accepted"] for d in docs.values()) != answered:
        return None
    return docs
