"""A `RESERVOIR_SIZE` changed while a chunk is being sampled keeps that chunk's sample honest.

A stratum's sample is every item whose priority is at or below its threshold (`stats.streams`);
the reservoir must hold all of them, whenever they arrived, or later arrivals weigh more than
earlier ones in the chunk's estimates.  Raised mid-chunk, a reservoir cut to the old size has
already dropped early items that the larger size would keep, so the new size applies from the
next chunk: the chunk under way keeps the size it opened with (`res_size` in its meta, OPEN_CHUNK)
and the request loop never lets a threshold pass its largest priority.  Lowered, a bottom-k of a
bottom-k is still a bottom-k, so the smaller size applies at once, but never to the items under a
threshold (bounded by the size the chunk opened with).  Against a real Redis, with the items and
priorities ingested alike into a reservoir large enough to keep everything.
"""

from __future__ import annotations

import numpy as np
import orjson
from redis.asyncio import Redis

from stratameter.config import load_settings
from stratameter.ingest.ingestor import ScoreIngestor
from stratameter.state.store import Store

SMALL = 16
T0 = 1_800_000_000_000  # chunk 500,000 of an hour (event times are not checked against the clock here)
NEXT = T0 + 3_600_000  # the next chunk


async def _ingest(ingest: ScoreIngestor, items: list[str], scores: np.ndarray, first: int, at: int = T0) -> None:
    for start in range(0, len(items), 250):
        n = len(items[start:start + 250])
        await ingest.apply(0, np.arange(first + start, first + start + n), ["clf"] * n, items[start:start + n],
                           scores[start:start + n], np.ones(n, bool), np.full(n, at), [None] * n)


async def _reservoirs(redis: Redis, store: Store, t: int, strata: int) -> list[dict[str, float]]:
    out = []
    for k in range(strata):
        members = await redis.zrange(f"{store.keys.chunk('clf', t)}:res:{k}", 0, -1, withscores=True)
        out.append({orjson.loads(m)["i"]: p for m, p in members})
    return out


def _ingestor(redis_url: str, store: Store, size: int, rng: np.random.Generator) -> ScoreIngestor:
    settings = load_settings({"STRATAMETER_REDIS_URL": redis_url, "STRATAMETER_RESERVOIR_SIZE": str(size)})
    return ScoreIngestor(store, settings, rng)


async def _two_phases(redis_url, unique_name, first_size: int, second_size: int, tau_rank: int | None):
    """Ingest 2,000 items at `first_size`, optionally set each stratum's threshold at its
    `tau_rank`-th lowest priority, then 6,000 more at `second_size`; the same into a reference
    reservoir keeping everything.  Returns the store, chunk, the thresholds, what the chunk's
    reservoirs keep and every item's priority, per stratum."""
    redis = Redis.from_url(redis_url)
    rng = np.random.default_rng(21)
    n1, n2 = 2000, 6000
    scores, items = rng.uniform(0.5, 1.0, n1 + n2), [f"i{i}" for i in range(n1 + n2)]
    store, everything = Store(redis, unique_name("changed")), Store(redis, unique_name("all"))
    changed_rng, all_rng = np.random.default_rng(5), np.random.default_rng(5)  # the same priorities
    first, reference = _ingestor(redis_url, store, first_size, changed_rng), _ingestor(redis_url, everything, 100_000,
                                                                                   all_rng)
    await _ingest(first, items[:n1], scores[:n1], 0)
    await _ingest(reference, items[:n1], scores[:n1], 0)
    t = (await store.chunks.chunk_ids("clf"))[0]
    strata = int((await store.chunks.chunk_states("clf", [t]))[0].strata)
    tau = None
    if tau_rank is not None:
        tau = [sorted((await _reservoirs(redis, store, t, strata))[k].values())[tau_rank] for k in range(strata)]
        await redis.hset(store.keys.chunk_meta("clf", t), "tau", orjson.dumps(tau))
    await _ingest(_ingestor(redis_url, store, second_size, changed_rng), items[n1:], scores[n1:], n1)
    await _ingest(reference, items[n1:], scores[n1:], n1)
    kept, truth = await _reservoirs(redis, store, t, strata), await _reservoirs(redis, everything, t, strata)
    return redis, store, t, tau, kept, truth


async def test_a_raised_reservoir_size_applies_from_the_next_chunk(redis_url, unique_name):
    redis, store, t, _, kept, truth = await _two_phases(redis_url, unique_name, SMALL, 4 * SMALL, None)
    for k, members in enumerate(kept):
        assert all(truth[k][i] == p for i, p in members.items())  # the same priorities in both runs
        # the bottom SMALL of the whole chunk, the early items as likely as the late ones (before:
        # 64 members, the early items' beyond the 16 lowest gone for good, the late ones' kept)
        assert set(members) == set(sorted(truth[k], key=truth[k].get)[:SMALL])
    (cs,) = await store.chunks.chunk_states("clf", [t])
    assert cs.reservoir_size == SMALL
    assert cs.effective_reservoir_size(4 * SMALL) == SMALL  # the loop's cap on the thresholds
    # the next chunk opens with the new size
    later = _ingestor(redis_url, store, 4 * SMALL, np.random.default_rng(6))
    await _ingest(later, [f"j{i}" for i in range(3000)], np.random.default_rng(7).uniform(0.5, 1.0, 3000), 9000,
                  at=NEXT)
    (nxt,) = await store.chunks.chunk_states("clf", [t + 1])
    assert nxt.reservoir_size == 4 * SMALL
    assert all(len(r) == 4 * SMALL for r in await _reservoirs(redis, store, t + 1, nxt.strata))
    await redis.aclose()


async def test_a_lowered_reservoir_size_keeps_the_items_under_a_threshold(redis_url, unique_name):
    opened, lowered = 2 * SMALL, SMALL // 2
    redis, store, t, tau, kept, truth = await _two_phases(redis_url, unique_name, opened, lowered, 20)
    for k, members in enumerate(kept):
        under = {i for i, p in truth[k].items() if p <= tau[k]}
        # more under the threshold than the lowered size's cap (4 x 8) would keep: the size
        # the chunk opened with (4 x 32) bounds the threshold sample (before: cut to 32, the latest lost)
        assert 4 * lowered < len(under) <= 4 * opened
        assert {i for i, p in members.items() if p <= tau[k]} == under
        # above the thresholds, the lowered size at once (a bottom-8 of the bottom-32)
        assert set(members) == under | set(sorted(truth[k], key=truth[k].get)[:lowered])
    (cs,) = await store.chunks.chunk_states("clf", [t])
    assert cs.effective_reservoir_size(lowered) == lowered
    await redis.aclose()
