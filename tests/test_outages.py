"""Outages: Kafka unreachable (the broker behind a `tansu proxy` that is stopped)
and Redis stopped and restarted.  The service keeps running, /readyz turns
false while it cannot work, it recovers by itself, and every count is exact."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest

from stratameter.embedded import EmbeddedRedis
from tests.harness import running_service, wait_for

pytestmark = pytest.mark.integration

OUTAGE_S = 10


async def _scores(run, cid: str) -> int:
    status, body = await run.get(f"/v1/classifiers/{cid}")
    return orjson.loads(body)["scores"] if status == 200 else 0


async def _ready(run) -> bool:
    return (await run.get("/readyz"))[0] == 200


async def _not_ready(run) -> bool:
    return (await run.get("/readyz"))[0] == 503


async def test_kafka_outage_behind_proxy(kafka_bootstrap, kafka_proxy, redis_url, unique_name):
    async with running_service(kafka_bootstrap, redis_url, unique_name, service_bootstrap=kafka_proxy.bootstrap,
                               STRATA="2") as run:
        now = int(time.time() * 1000)
        for i in range(500):
            await run.send_score(classifier_id="k", item_id=f"a{i}", score=0.6 + i / 2000, event_time=now)
        await wait_for(lambda: _scores_at_least(run, "k", 500), 30, "first scores")
        await wait_for(lambda: _ready(run), 10, "ready")
        kafka_proxy.stop()
        for i in range(700):  # produced straight to the broker while the service cannot reach it
            await run.send_score(classifier_id="k", item_id=f"b{i}", score=0.6 + i / 2000, event_time=now)
        await run.producer.flush()
        await wait_for(lambda: _not_ready(run), 15, "/readyz to report the outage")
        await asyncio.sleep(OUTAGE_S)
        assert await _scores(run, "k") == 500
        kafka_proxy.start()
        await wait_for(lambda: _ready(run), 30, "recovery")
        await wait_for(lambda: _scores_at_least(run, "k", 1200), 60, "the backlog")
        await asyncio.sleep(2)
        assert await _scores(run, "k") == 1200


async def test_redis_restart_loses_and_duplicates_nothing(kafka_bootstrap, unique_name, tmp_path):
    # a Redis with an append-only file, as production runs it, so its data survives the restart
    with EmbeddedRedis(extra_args=["--appendonly", "yes", "--appendfsync", "always"]) as redis:
        async with running_service(kafka_bootstrap, redis.url, unique_name, STRATA="2") as run:
            now = int(time.time() * 1000)
            for i in range(500):
                await run.send_score(classifier_id="r", item_id=f"a{i}", score=0.6 + i / 2000, event_time=now)
            await wait_for(lambda: _scores_at_least(run, "r", 500), 30, "first scores")
            redis.stop()
            for i in range(800):
                await run.send_score(classifier_id="r", item_id=f"b{i}", score=0.6 + i / 2000, event_time=now)
            await run.producer.flush()
            await wait_for(lambda: _not_ready(run), 15, "/readyz to report the outage")
            await asyncio.sleep(OUTAGE_S)
            redis.start()
            await wait_for(lambda: _ready(run), 30, "recovery")
            await wait_for(lambda: _scores_at_least(run, "r", 1300), 60, "the backlog")
            await asyncio.sleep(2)
            assert await _scores(run, "r") == 1300
            status, body = await run.get("/v1/classifiers/r")
            assert orjson.loads(body)["population"] == 1300


async def _scores_at_least(run, cid: str, n: int) -> bool:
    try:
        return await _scores(run, cid) >= n
    except (OSError, ValueError):
        return False
