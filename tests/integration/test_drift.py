"""Chunks by event time: a shift of the score distribution at a chunk boundary
moves that chunk's strata boundaries, against a real Redis."""

from __future__ import annotations

import time

import numpy as np
import pytest
from redis.asyncio import Redis

from stratameter.api.views import classifier_view
from stratameter.config import load_settings
from stratameter.ingest.ingestor import ScoreIngestor, opening_histogram
from stratameter.state.process import ProcessState
from stratameter.state.store import Store
from stratameter.stats.sketch import ScoreHistogram

pytestmark = pytest.mark.integration


def test_opening_histogram_prefers_a_large_opening_batch():
    previous = ScoreHistogram.from_scores(np.linspace(0.5, 0.6, 1000))
    big = ScoreHistogram.from_scores(np.linspace(0.9, 1.0, 100))
    small = ScoreHistogram.from_scores(np.linspace(0.9, 1.0, 99))
    assert opening_histogram(big, previous, 4) is big  # 100 = 25 per stratum x 4
    merged = opening_histogram(small, previous, 4)
    assert merged.total == 1099 and merged.min == 0.5 and merged.max == 1.0
    assert opening_histogram(small, None, 4) is small


async def test_shifted_scores_at_a_chunk_boundary_move_the_boundaries(redis_url, unique_name):
    settings = load_settings({"STRATAMETER_REDIS_URL": redis_url, "STRATAMETER_CHUNK_SECONDS": "60"})
    redis = Redis.from_url(redis_url)
    store = Store(redis, unique_name("drift"))
    ingest = ScoreIngestor(store, settings, np.random.default_rng(1))
    rng = np.random.default_rng(7)
    # Chunk A is the previous minute, chunk B the current one: both are event times the service
    # accepts now (A closes ALLOWED_LATENESS_SECONDS, here the default 300 s, after its end), none
    # in the future.
    now = int(time.time() * 1000)
    t0 = now - now % 60_000 - 60_000
    event_a, event_b = t0 + 5_000, t0 + 60_000
    lo, hi = settings.event_time_window(now)
    assert lo <= event_a < event_b <= now <= hi
    n = 2000
    before = rng.uniform(0.50, 0.70, n)  # chunk A
    after = rng.uniform(0.80, 1.00, n)  # chunk B: the classifier became more confident
    scores = np.concatenate([before, after])
    event = np.concatenate([np.full(n, event_a), np.full(n, event_b)])
    items = [f"i{i}" for i in range(2 * n)]
    # two partition batches, each spanning both chunks, to exercise chunk opening mid-stream
    for part, sl in ((0, slice(0, 2 * n, 2)), (1, slice(1, 2 * n, 2))):
        idx = np.arange(2 * n)[sl]
        await ingest.apply(part, np.arange(idx.size), ["clf"] * idx.size, [items[i] for i in idx], scores[idx],
                           np.ones(idx.size, bool), event[idx], [None] * idx.size)
    doc = await classifier_view(store.chunks, ProcessState(), "clf", settings.for_classifier("clf"))
    assert doc["scores"] == 2 * n
    chunk_a, chunk_b = doc["history"][0], doc  # reported = latest chunk (no labels anywhere yet)
    assert chunk_a["population"] == n and chunk_b["population"] == n
    cuts_a = [s["upper_score"] for s in chunk_a["strata"][:-1]]
    cuts_b = [s["upper_score"] for s in chunk_b["strata"][:-1]]
    assert len(cuts_a) == len(cuts_b) == 3
    assert all(0.5 < c < 0.7 for c in cuts_a), cuts_a
    assert all(0.8 < c < 1.0 for c in cuts_b), cuts_b
    # equal-count strata in each chunk: items are spread evenly over the fixed strata
    for chunk in (chunk_a, chunk_b):
        assert all(abs(s["items"] - n / 4) < 0.1 * n for s in chunk["strata"]), chunk["strata"]
    await redis.aclose()
