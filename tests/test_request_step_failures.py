"""A classifier whose label-request step fails on its own state (here a reservoir member it cannot
decode, as a version before b84daa2 could write) must not stop the label requests of the other
classifiers the instance owns: the loop steps them in id order, and the failure is counted
(`stratameter_request_step_failures_total`) and logged with the classifier."""

from __future__ import annotations

import logging
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from stratameter.embedded import group_consumer
from stratameter.ingest.aggregate import chunk_of
from stratameter.state.keys import Keys
from tests.harness import running_service, wait_for

pytestmark = pytest.mark.integration

BROKEN, FINE = "a-broken", "b-fine"  # the broken one is stepped first


def step_failures(metrics_text: str) -> dict[str, float]:
    return {s.labels["classifier"]: s.value for f in text_string_to_metric_families(metrics_text)
            if f.name == "stratameter_request_step_failures" for s in f.samples if s.name.endswith("_total")}


async def test_a_classifier_whose_step_fails_does_not_stop_the_others(kafka_bootstrap, redis_url, unique_name,
                                                                     caplog):
    caplog.set_level(logging.ERROR, logger="stratameter")
    async with running_service(kafka_bootstrap, redis_url, unique_name, DELTA="0.1") as run:
        settings = run.service.settings
        now_ms = int(time.time() * 1000)
        t = int(chunk_of([now_ms], settings.chunk_seconds)[0])
        keys = Keys(settings.redis_key_prefix)

        async def send(cid: str, n: int, first: int = 0) -> None:
            for i in range(first, first + n):
                await run.send_score(classifier_id=cid, item_id=f"{cid}-{i}", score=0.5 + i / 500, event_time=now_ms)
            await run.producer.flush()

        async with group_consumer(run.topics["requests"], bootstrap_servers=run.bootstrap,
                                  group_id=unique_name("requests")) as consumer:
            keys_seen: set[bytes] = set()

            async def requested(cid: str):
                batch = await consumer.getmany(timeout_ms=300)
                keys_seen.update(r.key for recs in batch.values() for r in recs)
                return cid.encode() in keys_seen

            await send(BROKEN, 200)
            await wait_for(lambda: requested(BROKEN), 60, f"{BROKEN}'s first label requests")
            strata = settings.for_classifier(BROKEN).strata
            for k in range(strata):  # lowest priority: due in every step from now on
                await run.service.redis.zadd(keys.reservoir(BROKEN, t, k), {'{"i":"cut': 0.0})
            await send(BROKEN, 20, first=200)  # its state moves: the loop reads its reservoirs again
            await send(FINE, 200)
            await wait_for(lambda: requested(FINE), 60, f"{FINE}'s label requests while {BROKEN}'s step fails")

        async def failures_counted():
            status, body = await run.get("/metrics")
            assert status == 200
            counted = step_failures(body.decode())
            return counted if counted.get(BROKEN, 0) > 0 else None

        counted = await wait_for(failures_counted, 30, f"{BROKEN}'s failing steps counted")
    assert counted[FINE] == 0
    failed = [r for r in caplog.records if r.getMessage() == "request loop step failed"]
    assert failed and all(getattr(r, "classifier", None) == BROKEN for r in failed)
    assert len(failed) <= 2  # a lasting failure is logged at most once a minute, not every pass
