"""Redis memory of a classifier is bounded by strata, reservoirs and retention,
not by stream length or age: old chunks lose their reservoirs, then their
summaries; answered requests expire after the retention period."""

from __future__ import annotations

import numpy as np
import pytest
from redis.asyncio import Redis

from stratameter.config import load_settings
from stratameter.ingest.ingestor import ScoreIngestor
from stratameter.state.process import ProcessState
from stratameter.state.store import Store

pytestmark = pytest.mark.integration


async def _memory(redis: Redis, prefix: str) -> int:
    total = 0
    async for key in redis.scan_iter(match=f"{prefix}:*", count=1000):
        total += await redis.memory_usage(key) or 0
    return total


async def test_old_chunks_are_purged_and_memory_stays_bounded(redis_backend, unique_name):
    settings = load_settings({"STRATAMETER_REDIS_URL": redis_backend.url, "STRATAMETER_CHUNK_SECONDS": "1",
                              "STRATAMETER_RESERVOIR_SIZE": "64"})
    prefix = unique_name("ret")
    redis = redis_backend.client()
    store = Store(redis, prefix)
    ingest = ScoreIngestor(store, settings, np.random.default_rng(0))
    rng = np.random.default_rng(1)
    offset = 0
    sizes = []
    for t in range(40):  # 40 one-second chunks of 500 predicted positives each
        n = 500
        await ingest.apply(0, np.arange(offset, offset + n), ["c"] * n, [f"i{offset + j}" for j in range(n)],
                           rng.random(n), np.ones(n, bool), np.full(n, 1_700_000_000_000 + 1000 * t + 5),
                           [None] * n)
        offset += n
        ids = await store.chunks.chunk_ids("c")
        await store.requests.purge_chunks("c", ids, keep_full=5, keep_history=10)
        if t in (19, 39):
            sizes.append(await _memory(redis, prefix))
    ids = await store.chunks.chunk_ids("c")
    assert len(ids) == 10
    with_reservoir = [t for t in ids if await redis.exists(f"{store.keys.chunk('c', t)}:res:0")]
    assert with_reservoir == ids[-5:]
    assert (await store.chunks.classifier_summary("c"))["meta"]["scores_total"] == str(40 * 500)
    # twice the stream, same memory (within 10%)
    assert abs(sizes[1] - sizes[0]) < 0.1 * sizes[0], sizes
    await redis.aclose()


async def test_issued_requests_expire_after_retention(redis_url, unique_name):
    redis = Redis.from_url(redis_url)
    store = Store(redis, unique_name("ttl"))
    assert await store.registry.acquire_lease("c", "me", 10_000)
    issued = await store.requests.issue("c", 1, 1_000, 2_000_000_000_000, 1, "me", [["c/tok", 0, "item", 0.9, "{}"]],
                                        {}, retention_ms=60_000)
    assert issued == ["c/tok"]
    ttl = await redis.pttl(store.keys.request("c", "c/tok"))
    assert ttl > 0
    await redis.aclose()


async def test_the_process_caches_keep_open_chunks_only(redis_url, unique_name):
    """A long-running replica gains no cache entry per classifier and chunk for good: the
    ingestor keeps the cuts of open chunks (the batch handler tells it the oldest open one),
    the request loop what it looked at in the chunks it steps."""
    from stratameter.requests.loop import RequestLoop
    from stratameter.requests.memory import Prior

    settings = load_settings({"STRATAMETER_REDIS_URL": redis_url, "STRATAMETER_CHUNK_SECONDS": "1"})
    redis = Redis.from_url(redis_url)
    store = Store(redis, unique_name("cache"))
    ingest = ScoreIngestor(store, settings, np.random.default_rng(0))
    rng = np.random.default_rng(1)
    for t in range(30):
        n = 200
        for cid in ("c", "d"):
            await ingest.apply(0, np.arange(t * n, (t + 1) * n), [cid] * n, [f"i{t}-{j}" for j in range(n)],
                               rng.random(n), np.ones(n, bool), np.full(n, 1_700_000_000_000 + 1000 * t + 5),
                               [None] * n)
        ingest.forget_closed_chunks(1_700_000_000 + t - 1)  # the chunk before this one still open
    assert sorted(ingest._cuts) == [("c", 1_700_000_028), ("c", 1_700_000_029), ("d", 1_700_000_028),
                                    ("d", 1_700_000_029)]
    assert all(t >= 1_700_000_028 for _, t in ingest._cutoffs)
    loop = RequestLoop(store, ProcessState(), settings, publish=None)
    memory = loop._remember("c")
    memory.seen.update({t: () for t in range(30)})
    memory.priors["c~negatives"] = {t: Prior(1.0, np.ones(1)) for t in range(30)}
    memory.unjudged.update(range(30))
    memory.keep_chunks([28, 29])
    assert list(memory.seen) == [28, 29] and list(memory.priors["c~negatives"]) == [28, 29]
    assert memory.unjudged == {28, 29}
    # a classifier whose lease went elsewhere is forgotten whole (both sides): one object a classifier
    other = loop._remember("d")
    other.seen[29], other.request_chunks["d~negatives"], other.finished = (), {"d~negatives/x": 29}, {27}
    loop.forget_unowned({"c"})
    assert set(loop._memory) == {"c"} and loop._memory["c"] is memory
    await redis.aclose()


async def test_a_classifier_silent_for_its_whole_history_is_forgotten(redis_backend, unique_name):
    """Every key of a classifier (both sides) goes and its id leaves `classifiers` once its newest
    chunk ended HISTORY_CHUNKS chunks ago and nothing awaits an answer; FORGET refuses if a score
    opened a newer chunk meanwhile; a classifier that still sends is kept."""
    from stratameter.requests.loop import RequestLoop

    settings = load_settings({"STRATAMETER_REDIS_URL": redis_backend.url, "STRATAMETER_CHUNK_SECONDS": "1",
                              "STRATAMETER_HISTORY_CHUNKS": "2", "STRATAMETER_CHUNK_RETENTION": "1",
                              "STRATAMETER_ALLOWED_LATENESS_SECONDS": "1", "STRATAMETER_METRICS": "precision,recall"})
    redis = redis_backend.client()
    prefix = unique_name("forget")
    store = Store(redis, prefix)
    ingest = ScoreIngestor(store, settings, np.random.default_rng(0))
    now_ms = int(__import__("time").time() * 1000)
    rng = np.random.default_rng(2)
    for cid, event_ms in (("old", now_ms - 10_000), ("live", now_ms), ("was", now_ms - 10_000)):
        n = 300
        await ingest.apply(0, np.arange(n), [cid] * n, [f"i{j}" for j in range(n)], rng.random(n),
                           rng.random(n) < 0.5, np.full(n, event_ms), [None] * n)
    assert await redis.exists(store.keys.meta("old~negatives"))  # both sides have state
    # a refused FORGET: the caller saw an older newest chunk than there is
    ids = await store.chunks.chunk_ids("old")
    assert not await store.requests.forget("old", [ids[-1] - 5])
    assert await redis.exists(store.keys.meta("old"))
    loop = RequestLoop(store, ProcessState(), settings, publish=None)
    await loop.step("old")
    await loop.step("live")
    assert [k async for k in redis.scan_iter(f"{prefix}:{{old}}*")] == []
    assert await store.registry.classifiers() == ["live", "was"]
    assert await redis.exists(store.keys.meta("live")) and await redis.exists(store.keys.meta("live~negatives"))
    # recall no longer enabled: the negatives' state of the time it was goes with the classifier
    precision_only = load_settings({"STRATAMETER_REDIS_URL": redis_backend.url, "STRATAMETER_CHUNK_SECONDS": "1",
                                    "STRATAMETER_HISTORY_CHUNKS": "2", "STRATAMETER_ALLOWED_LATENESS_SECONDS": "1"})
    assert await redis.exists(store.keys.meta("was~negatives"))
    await RequestLoop(store, ProcessState(), precision_only, publish=None).step("was")
    assert [k async for k in redis.scan_iter(f"{prefix}:{{was}}*")] == []
    await redis.aclose()


async def test_a_purge_skips_the_chunks_purged_before(redis_backend, unique_name):
    """Once a new chunk: only the chunk that just left the retention (and any leaving the history)
    is purged, not every older chunk again."""
    settings = load_settings({"STRATAMETER_REDIS_URL": redis_backend.url, "STRATAMETER_CHUNK_SECONDS": "1",
                              "STRATAMETER_RESERVOIR_SIZE": "64"})
    redis = redis_backend.client()
    store = Store(redis, unique_name("ret"))
    ingest = ScoreIngestor(store, settings, np.random.default_rng(0))
    rng = np.random.default_rng(1)

    async def chunk(t: int) -> list[int]:
        n = 100
        await ingest.apply(0, np.arange(100 * t, 100 * t + n), ["c"] * n, [f"i{100 * t + j}" for j in range(n)],
                           rng.random(n), np.ones(n, bool), np.full(n, 1_700_000_000_000 + 1000 * t + 5), [None] * n)
        return await store.chunks.chunk_ids("c")

    for t in range(8):
        ids = await chunk(t)
    # the first purge: every old chunk
    assert await store.requests.purge_chunks("c", ids, keep_full=3, keep_history=6) == 5
    ids = await store.chunks.chunk_ids("c")
    assert len(ids) == 6
    purged_through = ids[-4]
    ids = await chunk(8)
    # the chunk leaving the retention and the one leaving the history, no other
    assert await store.requests.purge_chunks("c", ids, keep_full=3, keep_history=6, purged_through=purged_through) == 2
    ids = await store.chunks.chunk_ids("c")
    with_reservoir = [t for t in ids if await redis.exists(f"{store.keys.chunk('c', t)}:res:0")]
    assert len(ids) == 6 and with_reservoir == ids[-3:]
    await redis.aclose()
