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

    admission = ClassifierAdmission(store.registry, cap=3)
    assert await admission.refused(["a", "b", "a"]) == set()
    assert await admission.refused(["e", "c", "d"]) == {"d", "e"}  # one room left: the first id in order
    assert await admission.refused(["a", "c"]) == set()  # admitted ones stay admitted
    await store.redis.sadd(store.keys.classifiers, "a", "b", "c")  # what INGEST writes
    assert await admission.refused(["f"]) == {"f"} and admission.fresh == set()
    other = ClassifierAdmission(store.registry, cap=3)  # another replica: sees the set
    assert await other.refused(["b", "z"]) == {"z"}


async def test_twenty_thousand_ids_the_service_keeps_running_under_the_cap(kafka_bootstrap, redis_url, unique_name):
    """The cardinality attack at scale: 20,000 distinct ids, one record each, against a cap of
    500: 500 classifiers (state, series, request loops), 19,500 records dead-lettered and counted,
    no key for a refused id, and the service still answers and counts a real classifier."""
    cap, ids = 500, 20_000
    async with running_service(kafka_bootstrap, redis_url, unique_name, MAX_CLASSIFIERS=str(cap)) as run:
        now_ms = int(time.time() * 1000)
        for i in range(ids):
            await run.send_score(classifier_id=f"id-{i:05d}", item_id="x", score=0.9, event_time=now_ms)
        await run.producer.flush()

        async def refused_all():
            _, body = await run.get("/metrics")
            line = next((ln for ln in body.decode().splitlines() if 'reason="too_many_classifiers"' in ln), "")
            return line.endswith(f" {float(ids - cap)}")
        await wait_for(refused_all, 90, f"{ids - cap} refused records counted")
        _, body = await run.get("/v1/classifiers")
        admitted = orjson.loads(body)
        assert len(admitted) == cap
        for i in range(20):  # an admitted classifier keeps working
            await run.send_score(classifier_id=admitted[0], item_id=f"y{i}", score=0.8, event_time=now_ms)
        await run.producer.flush()

        async def counted():
            status, body = await run.get(f"/v1/classifiers/{admitted[0]}")
            return status == 200 and orjson.loads(body)["scores"] == 21
        await wait_for(counted, 30, "the admitted classifier's records counted")

        async def every_admitted_exported():
            _, body = await run.get("/metrics")
            return body.decode().count("stratameter_scores_total{classifier=") == cap
        await wait_for(every_admitted_exported, 30, "the admitted classifiers' series")
        redis = Redis.from_url(redis_url)
        try:
            prefix = run.service.settings.redis_key_prefix
            assert await redis.scard(f"{prefix}:{{_global}}:classifiers") == cap
            tags = {k.decode().split("{", 1)[1].split("}", 1)[0] async for k in redis.scan_iter(f"{prefix}:*", count=5000)}
            assert tags - {"_global"} == set(admitted)
        finally:
            await redis.aclose()
