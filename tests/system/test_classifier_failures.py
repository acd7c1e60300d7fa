"""Failures of one classifier's own (here state it cannot read, as an older version or a bug could
leave it) stay with it: the request loop steps the other classifiers (in id order, after it), and
/metrics keeps exporting theirs.  Each failure is counted
(`stratameter_classifier_failures_total{classifier,stage}`) and logged with the classifier, not on
every pass or scrape."""

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
MESSAGE = "classifier failure confined to it"


def failures(metrics_text: str) -> dict[tuple[str, str], float]:
    """``stratameter_classifier_failures_total`` by (classifier, stage)."""
    return {(s.labels["classifier"], s.labels["stage"]): s.value for f in text_string_to_metric_families(metrics_text)
            if f.name == "stratameter_classifier_failures" for s in f.samples if s.name.endswith("_total")}


def series_of(metrics_text: str, name: str) -> set[str]:
    return {s.labels["classifier"] for f in text_string_to_metric_families(metrics_text) for s in f.samples
            if s.name == name}


async def metrics_text(run) -> str:
    status, body = await run.get("/metrics")
    assert status == 200, body[:500]
    return body.decode()


def send_scores(run, now_ms: int):
    async def send(cid: str, n: int, first: int = 0) -> None:
        for i in range(first, first + n):
            await run.send_score(classifier_id=cid, item_id=f"{cid}-{i}", score=0.5 + i / 500, event_time=now_ms)
        await run.producer.flush()
    return send


async def test_a_classifier_whose_step_fails_does_not_stop_the_others(kafka_bootstrap, redis_url, unique_name,
                                                                     caplog):
    """A reservoir member the loop cannot decode (written before b84daa2 by an item id ending in a
    quote and a comma) failed `a-broken`'s every step; the pass ended there, so `b-fine` never got a
    label request."""
    caplog.set_level(logging.ERROR, logger="stratameter")
    async with running_service(kafka_bootstrap, redis_url, unique_name, DELTA="0.1") as run:
        settings = run.service.settings
        now_ms = int(time.time() * 1000)
        t = int(chunk_of([now_ms], settings.chunk_seconds)[0])
        keys, send = Keys(settings.redis_key_prefix), send_scores(run, now_ms)
        async with group_consumer(run.topics["requests"], bootstrap_servers=run.bootstrap,
                                  group_id=unique_name("requests")) as consumer:
            keys_seen: set[bytes] = set()

            async def requested(cid: str):
                batch = await consumer.getmany(timeout_ms=300)
                keys_seen.update(r.key for recs in batch.values() for r in recs)
                return cid.encode() in keys_seen

            await send(BROKEN, 200)
            await wait_for(lambda: requested(BROKEN), 60, f"{BROKEN}'s first label requests")
            for k in range(settings.for_classifier(BROKEN).strata):  # lowest priority: due in every step
                await run.service.redis.zadd(keys.reservoir(BROKEN, t, k), {'{"i":"cut': 0.0})
            await send(BROKEN, 20, first=200)  # its state moves: the loop reads its reservoirs again
            await send(FINE, 200)
            await wait_for(lambda: requested(FINE), 60, f"{FINE}'s label requests while {BROKEN}'s step fails")

        async def counted():
            found = failures(await metrics_text(run))
            return found if found.get((BROKEN, "request_loop"), 0) > 0 else None

        found = await wait_for(counted, 30, f"{BROKEN}'s failing steps counted")
    assert found[(FINE, "request_loop")] == 0 and found[(BROKEN, "metrics")] == 0
    logged = [r for r in caplog.records if r.getMessage() == MESSAGE]
    assert logged and all((r.classifier, r.stage) == (BROKEN, "request_loop") for r in logged)
    assert len(logged) <= 2  # a lasting failure is logged at most once a minute, not on every pass


async def test_a_classifier_whose_figures_cannot_be_read_leaves_the_others_on_metrics(kafka_bootstrap, redis_url,
                                                                                     unique_name, caplog):
    """A chunk field `a-broken`'s figures cannot parse failed the whole scrape (HTTP 503), so
    Prometheus marked the replica's scrape failed and every classifier it owns went stale."""
    caplog.set_level(logging.ERROR, logger="stratameter")
    async with running_service(kafka_bootstrap, redis_url, unique_name) as run:
        settings = run.service.settings
        now_ms = int(time.time() * 1000)
        t = int(chunk_of([now_ms], settings.chunk_seconds)[0])
        send = send_scores(run, now_ms)
        await send(BROKEN, 50)
        await send(FINE, 50)

        async def both_exported():
            return series_of(await metrics_text(run), "stratameter_scores_total") >= {BROKEN, FINE}

        await wait_for(both_exported, 60, "both classifiers on /metrics")
        await run.service.redis.hset(Keys(settings.redis_key_prefix).chunk_meta(BROKEN, t), "round", "two")
        for _ in range(3):
            text = await metrics_text(run)
        assert series_of(text, "stratameter_scores_total") == {FINE}
        found = failures(text)
        assert found[(BROKEN, "metrics")] == 3 and found[(FINE, "metrics")] == 0
    logged = [r for r in caplog.records if r.getMessage() == MESSAGE and r.stage == "metrics"]
    assert len(logged) == 1 and logged[0].classifier == BROKEN
