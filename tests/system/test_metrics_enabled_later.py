"""Recall, F1 or accuracy enabled on a classifier that was measured for precision alone: the
chunk under way at the switch has only part of its predicted negatives in their state, so the
metrics that need them are not estimated for it (`chunks.lifecycle.counted_whole`), its
negatives are not sampled, and the chunks after the switch get all four metrics."""

from __future__ import annotations

import time

import numpy as np
import pytest
from redis.asyncio import Redis
from scipy.special import expit

from stratameter.config import load_settings
from stratameter.ingest.ingestor import ScoreIngestor
from stratameter.state.keys import negatives_of
from stratameter.state.store import Store
from stratameter.chunks.lifecycle import counted_whole
from tests.harness import run_until, service_env, service_topics

pytestmark = pytest.mark.integration

T0 = 1_800_000_000_000
ALL = "precision,recall,f1,accuracy"


def test_a_chunk_is_complete_after_the_last_unpaired_event_time():
    assert counted_whole(5, 60, None)
    assert not counted_whole(5, 60, 5 * 60_000)  # at its first millisecond
    assert not counted_whole(5, 60, 7 * 60_000)  # in a later chunk: a late record may have been in it
    assert counted_whole(5, 60, 5 * 60_000 - 1)


def _batch(first: int, n: int, event_ms: int):
    offs = np.arange(first, first + n)
    return (offs, ["c"] * n, [f"i{o}" for o in offs], np.linspace(0.01, 0.99, n), np.linspace(0.01, 0.99, n) >= 0.5,
            np.full(n, event_ms), [None] * n)


async def test_ingest_notes_the_latest_event_time_counted_without_the_negatives(redis_url, unique_name):
    """Precision alone: each call is unpaired and INGEST keeps the latest event time among them (a
    late record does not lower it, a replay does not move it); with the negatives sampled the mark
    stays where it was and the negatives' state counts every record from then on."""
    redis = Redis.from_url(redis_url)
    store = Store(redis, unique_name("pair"))
    alone = ScoreIngestor(store, load_settings({"STRATAMETER_REDIS_URL": redis_url}), np.random.default_rng(0))
    both = ScoreIngestor(store, load_settings({"STRATAMETER_REDIS_URL": redis_url, "STRATAMETER_METRICS": ALL}),
                         np.random.default_rng(1))
    assert await store.chunks.unpaired_through("c") is None
    await alone.apply(0, *_batch(0, 50, T0 + 5_000))
    await alone.apply(0, *_batch(50, 50, T0 + 1_000))  # late
    assert await store.chunks.unpaired_through("c") == T0 + 5_000
    await alone.apply(0, *_batch(0, 50, T0 + 9_000))  # a replay: nothing applied
    assert await store.chunks.unpaired_through("c") == T0 + 5_000
    assert await both.apply(0, *_batch(100, 100, T0 + 20_000)) == 100
    assert await store.chunks.unpaired_through("c") == T0 + 5_000
    neg = (await store.chunks.classifier_summary(negatives_of("c")))["meta"]
    assert int(neg["scores_total"]) == 100
    await alone.apply(0, *_batch(200, 10, T0 + 30_000))  # the negatives off again
    assert await store.chunks.unpaired_through("c") == T0 + 30_000
    await redis.aclose()


def _population(n: int, seed: int):
    """A whole stream with 5 % prevalence: probabilities, threshold 0.5."""
    rng = np.random.default_rng(seed)
    y = rng.random(n) < 0.05
    return expit(np.where(y, rng.normal(1.5, 1.3, n), rng.normal(-2.5, 1.3, n))), y


def _truth(score, y) -> dict[str, float]:
    pred = score >= 0.5
    tp, fp, fn = int(np.sum(pred & y)), int(np.sum(pred & ~y)), int(np.sum(~pred & y))
    return {"precision": tp / (tp + fp), "recall": tp / (tp + fn), "f1": 2 * tp / (2 * tp + fp + fn),
            "accuracy": float(np.mean(pred == y))}


async def test_metrics_enabled_mid_chunk(kafka_bootstrap, redis_url, unique_name):
    """The service runs with precision alone while chunk A fills, then restarts with every metric: A's
    second half and chunk B follow.  A reports precision only (`negatives_complete` false, the
    other metrics null, no request for its negatives); B converges on all four, covering the truth."""
    topics = await service_topics(kafka_bootstrap, unique_name, 1)
    env = service_env(kafka_bootstrap, redis_url, topics, unique_name, CHUNK_SECONDS="60",
                      ALLOWED_LATENESS_SECONDS="1800", DELTA="0.1", CONFIDENCE="0.999", MAX_LABELS_PER_HOUR="20000")
    a_score, a_y = _population(2000, 3)
    b_score, b_y = _population(4000, 4)
    chunk_a = int(time.time()) // 60 - 3  # both chunks started, and open all the test long
    a_ms, b_ms = chunk_a * 60_000 + 1_000, (chunk_a + 1) * 60_000 + 1_000

    def answer(req):
        kind, i = req["item_id"][0], int(req["item_id"][1:])
        assert kind == "b" or req["predicted_positive"], req  # chunk A's negatives are never sampled
        return bool((a_y if kind == "a" else b_y)[i])

    async def run(metrics, items, until):
        return await run_until({**env, "METRICS": metrics}, kafka_bootstrap, unique_name,
                               [(f"{kind}{i}", s, ms) for kind, i, s, ms in items], answer, until)

    half = len(a_score) // 2
    await run("precision", [("a", i, a_score[i], a_ms) for i in range(half)], lambda d: d["scores"] == half)
    items = ([("a", i, a_score[i], a_ms) for i in range(half, len(a_score))]
             + [("b", i, s, b_ms) for i, s in enumerate(b_score)])
    doc = await run(ALL, items, lambda d: d["scores"] == len(a_score) + len(b_score) and d["status"] == "converged"
                    and d["history"] and d["history"][0]["estimate"] is not None)
    a_doc, b_doc = doc["history"][0], doc
    assert a_doc["negatives_complete"] is False and b_doc["negatives_complete"] is True
    assert a_doc["estimate"] is not None
    assert all(a_doc["metrics"][m]["estimate"] is None for m in ("recall", "f1", "accuracy"))
    assert sum(s["labels"] for s in a_doc["strata"] if s["side"] == "negative") == 0
    truth = _truth(b_score, b_y)
    assert b_doc["population"] == len(b_score)
    for m, iv in b_doc["metrics"].items():
        assert iv["ci_lower"] <= truth[m] <= iv["ci_upper"], (m, truth[m], iv)
    assert sum(s["labels"] for s in b_doc["strata"] if s["side"] == "negative") > 0
