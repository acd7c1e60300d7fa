"""A threshold set while a reservoir still had room keeps admitting what arrives under it.

Threshold sampling (`stats.streams`) samples every item of a stratum whose priority is
at or below the stratum's threshold, whenever it arrives.  A reservoir keeps its
RESERVOIR_SIZE lowest priorities; when more items arrive than the forecast said, its
largest kept priority falls below a threshold set earlier, and INGEST must still keep
the items under the threshold (up to `aggregate.SAMPLE_CAP` x RESERVOIR_SIZE), or the
sample would no longer be the threshold sample the estimator assumes.  Against a real
Redis: the same items and priorities ingested into a small reservoir with thresholds and
into one large enough to keep everything.
"""

from __future__ import annotations

import numpy as np
import orjson
from redis.asyncio import Redis

from stratameter.config import load_settings
from stratameter.ingest.aggregate import SAMPLE_CAP
from stratameter.ingest.ingestor import ScoreIngestor
from stratameter.state.store import Store

SMALL = 16
T0 = 1_800_000_000_000  # one chunk (event times are not checked against the clock here)


async def _ingest(ingest: ScoreIngestor, items: list[str], scores: np.ndarray, first: int) -> None:
    for start in range(0, len(items), 250):
        n = len(items[start:start + 250])
        await ingest.apply(0, np.arange(first + start, first + start + n), ["clf"] * n, items[start:start + n],
                           scores[start:start + n], np.ones(n, bool), np.full(n, T0), [None] * n)


async def _reservoirs(redis: Redis, store: Store, strata: int) -> list[dict[str, float]]:
    t = (await store.chunks.chunk_ids("clf"))[0]
    out = []
    for k in range(strata):
        members = await redis.zrange(f"{store.keys.chunk('clf', t)}:res:{k}", 0, -1, withscores=True)
        out.append({orjson.loads(m)["i"]: p for m, p in members})
    return out


async def test_items_under_a_threshold_stay_in_a_full_reservoir(redis_url, unique_name):
    redis = Redis.from_url(redis_url)
    rng = np.random.default_rng(11)
    n1, n2 = 2000, 6000
    scores = rng.uniform(0.5, 1.0, n1 + n2)
    items = [f"i{i}" for i in range(n1 + n2)]
    stores, ingestors = {}, {}
    for name, size in (("small", SMALL), ("all", 100_000)):
        settings = load_settings({"STRATAMETER_REDIS_URL": redis_url, "STRATAMETER_RESERVOIR_SIZE": str(size)})
        stores[name] = Store(redis, unique_name(name))
        ingestors[name] = ScoreIngestor(stores[name], settings, np.random.default_rng(3))  # the same priorities
        await _ingest(ingestors[name], items[:n1], scores[:n1], 0)
    small, everything = stores["small"], stores["all"]
    t = (await small.chunks.chunk_ids("clf"))[0]
    strata = int((await small.chunks.chunk_states("clf", [t]))[0].strata)
    # each stratum's threshold at its 12th-lowest priority so far (what ISSUE stores with a round)
    tau = [sorted((await _reservoirs(redis, small, strata))[k].values())[11] for k in range(strata)]
    await redis.hset(small.keys.chunk("clf", t) + ":meta", "tau", orjson.dumps(tau))
    for name in stores:
        await _ingest(ingestors[name], items[n1:], scores[n1:], n1)

    kept, truth = await _reservoirs(redis, small, strata), await _reservoirs(redis, everything, strata)
    for k in range(strata):
        assert all(truth[k][i] == p for i, p in kept[k].items())  # the same priorities in both runs
        under = {i for i, p in truth[k].items() if p <= tau[k]}
        assert SMALL < len(under) <= SAMPLE_CAP * SMALL  # the reservoir overflowed under the threshold
        assert {i for i, p in kept[k].items() if p <= tau[k]} == under  # every item under it is there
        bottom = set(sorted(truth[k], key=truth[k].get)[:SMALL])
        assert set(kept[k]) == under | bottom  # and nothing else beyond the bottom-k
    await redis.aclose()


async def test_a_reservoir_without_a_threshold_is_the_bottom_k(redis_url, unique_name):
    settings = load_settings({"STRATAMETER_REDIS_URL": redis_url, "STRATAMETER_RESERVOIR_SIZE": str(SMALL)})
    redis = Redis.from_url(redis_url)
    store = Store(redis, unique_name("plain"))
    rng = np.random.default_rng(12)
    await _ingest(ScoreIngestor(store, settings, np.random.default_rng(4)), [f"i{i}" for i in range(3000)],
                  rng.uniform(0.5, 1.0, 3000), 0)
    t = (await store.chunks.chunk_ids("clf"))[0]
    strata = int((await store.chunks.chunk_states("clf", [t]))[0].strata)
    assert all(len(r) == SMALL for r in await _reservoirs(redis, store, strata))
    await redis.aclose()
