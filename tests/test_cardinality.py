"""Bounded cardinality through the real service: past STRATAMETER_MAX_CLASSIFIERS a score for
a new classifier id is dead-lettered with its reason and counted, and creates no state, no
series and no label requests; the classifiers admitted before keep working."""

from __future__ import annotations

import time

import orjson
import pytest
from redis.asyncio import Redis

from tests.harness import read_topic, running_service, wait_for

pytestmark = pytest.mark.integration


async def test_new_classifier_ids_past_the_cap_are_dead_lettered_and_create_nothing(kafka_bootstrap, redis_url,
                                                                                   unique_name):
    async with running_service(kafka_bootstrap, redis_url, unique_name, MAX_CLASSIFIERS="3",
                               BATCH_MAX_RECORDS="50") as run:
        now_ms = int(time.time() * 1000)
        first = [f"clf-{i}" for i in range(3)]
        for cid in first:
            for i in range(20):
                await run.send_score(classifier_id=cid, item_id=f"{cid}/{i}", score=0.9, event_time=now_ms)
        await run.producer.flush()

        async def scores(cid):
            status, body = await run.get(f"/v1/classifiers/{cid}")
            return orjson.loads(body)["scores"] if status == 200 else 0

        async def counted(n):
            return all([await scores(c) == n for c in first])
        await wait_for(lambda: counted(20), 30, "the first three classifiers")
        junk = [f"junk-{i:05d}" for i in range(200)]  # the cardinality attack, interleaved with real traffic
        for j, cid in enumerate(junk):
            await run.send_score(classifier_id=cid, item_id="x", score=0.9, event_time=now_ms)
            await run.send_score(classifier_id=first[j % 3], item_id=f"more/{j}", score=0.9, event_time=now_ms)
        await run.producer.flush()

        async def refused_all():
            _, body = await run.get("/metrics")
            text = body.decode()
            line = next((ln for ln in text.splitlines() if 'reason="too_many_classifiers"' in ln), "")
            return text if line.endswith(" 200.0") else None
        async def counted_all():
            return sum([await scores(c) for c in first]) == 60 + 200
        text = await wait_for(refused_all, 30, "200 refused records counted")
        _, body = await run.get("/v1/classifiers")
        assert orjson.loads(body) == first
        await wait_for(lambda: counted_all(), 30, "the admitted classifiers' records all counted")
        assert "junk-" not in text  # no series for a refused id
        dead = await read_topic(run.bootstrap, run.topics["dlq"], unique_name("dlq"), expect=200, timeout=20)
        assert len(dead) == 200 and {d["reason"] for d in dead} == {"too_many_classifiers"}
        assert "STRATAMETER_MAX_CLASSIFIERS" in dead[0]["detail"]
        redis = Redis.from_url(redis_url)
        try:
            prefix = run.service.settings.redis_key_prefix
            assert [k async for k in redis.scan_iter(f"{prefix}:{{junk-*")] == []
            assert await redis.scard(f"{prefix}:{{_global}}:classifiers") == 3
        finally:
            await redis.aclose()


async def test_admission_counts_ids_admitted_but_not_yet_written(store):
    """Unit test of `ClassifierAdmission` on a real Redis: the room is the cap less the
    classifiers set and less the ids admitted here that INGEST has not written yet."""
    from stratameter.ingest.admission import ClassifierAdmission

    admission = ClassifierAdmission(store, cap=3)
    assert await admission.refused(["a", "b", "a"]) == set()
    assert await admission.refused(["e", "c", "d"]) == {"d", "e"}  # one room left: the first id in order
    assert await admission.refused(["a", "c"]) == set()  # admitted ones stay admitted
    await store.redis.sadd(store.keys.classifiers, "a", "b", "c")  # what INGEST writes
    assert await admission.refused(["f"]) == {"f"} and admission.fresh == set()
    other = ClassifierAdmission(store, cap=3)  # another replica: sees the set
    assert await other.refused(["b", "z"]) == {"z"}
