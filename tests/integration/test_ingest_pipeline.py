"""The two-stage ingest: batches prepared ahead of their apply (predicted offsets)
and batches redone after a Redis failure lose and double-count nothing."""

from __future__ import annotations

import numpy as np
import pytest
from redis.asyncio import Redis

from stratameter.config import load_settings
from stratameter.ingest.ingestor import ScoreIngestor
from stratameter.state.store import Store

pytestmark = pytest.mark.integration

T0 = 1_800_000_000_000


def _batch(first: int, n: int, cids=("a", "b")):
    offs = np.arange(first, first + n)
    ids = [cids[i % len(cids)] for i in range(n)]
    return (offs, ids, [f"i{o}" for o in offs], np.linspace(0.5, 1, n), np.ones(n, bool), np.full(n, T0 + 1), [None] * n)


async def _scores(store: Store, cid: str) -> int:
    return int((await store.chunks.classifier_summary(cid))["meta"].get("scores_total", 0))


async def test_batch_redone_after_a_failure_while_the_next_was_prepared(redis_url, unique_name):
    settings = load_settings({"STRATAMETER_REDIS_URL": redis_url})
    redis = Redis.from_url(redis_url)
    store = Store(redis, unique_name("pipe"))
    ingest = ScoreIngestor(store, settings, np.random.default_rng(0))
    k0, k1, k2 = _batch(0, 100), _batch(100, 100), _batch(200, 100)
    assert await ingest.submit(await ingest.prepare(0, *k0)) == 100
    first = await ingest.prepare(0, *k1)  # predicts offsets after k1 ...
    ahead = await ingest.prepare(0, *k2)  # ... and k2 is prepared on that prediction
    del first  # k1's apply "fails" (Redis down): the batch is redone from scratch
    redone = await ingest.prepare(0, *k1, reload_offsets=True)
    assert await ingest.submit(redone) == 100
    assert await ingest.submit(ahead) == 100
    assert await _scores(store, "a") + await _scores(store, "b") == 300
    # replaying everything (a restart from older committed offsets) changes nothing
    for batch in (k0, k1, k2):
        assert await ingest.submit(await ingest.prepare(0, *batch, reload_offsets=True)) == 0
    assert await _scores(store, "a") + await _scores(store, "b") == 300
    await redis.aclose()


async def test_wrong_predictions_are_corrected_by_compare_and_set(redis_url, unique_name):
    settings = load_settings({"STRATAMETER_REDIS_URL": redis_url})
    redis = Redis.from_url(redis_url)
    store = Store(redis, unique_name("cas"))
    mine, other = (ScoreIngestor(store, settings, np.random.default_rng(s)) for s in (1, 2))
    k0, k1 = _batch(0, 80), _batch(80, 80)
    ahead = await mine.prepare(0, *k1)  # predicts offsets that were never written
    assert await other.submit(await other.prepare(0, *k0)) == 80  # another instance applied k0
    assert await mine.submit(ahead) == 80  # refused, re-aggregated from the stored offsets
    assert await mine.submit(await mine.prepare(0, *k0)) == 0  # k0 again: a replay
    assert await _scores(store, "a") + await _scores(store, "b") == 160
    await redis.aclose()
