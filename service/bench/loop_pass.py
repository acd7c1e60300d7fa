"""`stratameter bench --loop-pass`: what one pass of the request loop costs per classifier when
reviewers are slow, so that closed chunks older than the newest two still wait for their answers
(`chunks.lifecycle.sampled_chunks`).  No Kafka: the classifiers' state is ingested straight into Redis
(`ScoreIngestor`), requests are published nowhere and never answered.  Measured in the same run
with no older chunk (the newest two only), the floor a pass cannot go below."""

from __future__ import annotations

import asyncio
import time
import uuid

import numpy as np

#: Seconds a chunk lasts in this bench (short, so a dozen closed chunks fit in a quarter hour).
CHUNK_SECONDS = 60
#: Predicted positives ingested into every chunk.
ITEMS_PER_CHUNK = 400
#: Passes timed after the two that issue the first rounds and see them pending.
PASSES = 5


async def _redis_commands(redis) -> int:
    stats = await redis.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")


async def _state(store, settings, cids: list[str], older: int, now_ms: int) -> None:
    """Each classifier's newest chunk, the one before it and `older` closed chunks before those."""
    from ..ingest.ingestor import ScoreIngestor

    ingest = ScoreIngestor(store, settings, np.random.default_rng(0))
    rng = np.random.default_rng(1)
    now_t, n, offset = now_ms // (CHUNK_SECONDS * 1000), ITEMS_PER_CHUNK, 0
    for cid in cids:
        for t in range(now_t - older - 1, now_t + 1):
            await ingest.apply(0, np.arange(offset, offset + n), [cid] * n, [f"{cid}-{t}-{k}" for k in range(n)],
                               0.5 + rng.random(n) / 2, np.ones(n, bool), np.full(n, t * CHUNK_SECONDS * 1000 + 1000),
                               [None] * n)
            offset += n


async def one_setting(redis_url: str, classifiers: int, older: int) -> dict:
    """Ingest, take every lease, run two passes (the first rounds go out, then wait), then time
    `PASSES` more.  Per classifier and pass: wall and CPU milliseconds (medians), Redis commands."""
    from ..config import load_settings
    from ..requests.loop import RequestLoop
    from ..stats import streams
    from ..state.process import ProcessState
    from ..state.store import Store

    prefix = f"bench-loop-{uuid.uuid4().hex[:8]}"
    settings = load_settings({"STRATAMETER_REDIS_URL": redis_url, "STRATAMETER_REDIS_KEY_PREFIX": prefix,
                              "STRATAMETER_CHUNK_SECONDS": str(CHUNK_SECONDS),
                              "STRATAMETER_ALLOWED_LATENESS_SECONDS": "0", "STRATAMETER_INSTANCE_ID": "bench",
                              "STRATAMETER_MAX_LABELS_PER_HOUR": "100000"})
    redis = settings.redis_client()
    store = Store(redis, prefix)
    cids = [f"loop-{i:04d}" for i in range(classifiers)]
    published: list = []

    async def publish(records: list) -> None:
        published.extend(records)

    try:
        await _state(store, settings, cids, older, int(time.time() * 1000))
        # the newest chunk's items arrived in one burst: once it has been silent this long its stream has
        # stopped (`streams.arrivals_flowing`), so every pass plans the same way whenever it runs (while
        # it flows, the paced thresholds rise with the clock and a pass may issue a few more requests)
        await asyncio.sleep(2 * streams.min_silence(CHUNK_SECONDS))
        loop = RequestLoop(store, ProcessState(), settings, publish)
        for cid in cids:
            if not await store.registry.acquire_lease(cid, "bench", 3_600_000):
                raise RuntimeError(f"could not take the lease of {cid}")
        wall, cpu, commands = [], [], []
        for p in range(2 + PASSES):
            before = await _redis_commands(redis)
            t0, c0 = time.perf_counter(), time.process_time()
            for cid in cids:
                await loop.step(cid)
            if p >= 2:
                wall.append((time.perf_counter() - t0) * 1000 / classifiers)
                cpu.append((time.process_time() - c0) * 1000 / classifiers)
                commands.append((await _redis_commands(redis) - before) / classifiers)
        pending = sum([await redis.zcard(store.keys.pending(cid)) for cid in cids])
        return {"older_chunks": older, "ms_per_classifier": round(float(np.median(wall)), 3),
                "cpu_ms_per_classifier": round(float(np.median(cpu)), 3),
                "redis_commands_per_classifier": round(float(np.median(commands)), 1),
                "requests_pending_per_classifier": round(pending / classifiers, 1)}
    finally:
        await redis.aclose()


async def loop_pass_bench(redis_url: str, classifiers: int, older: int) -> dict:
    """`one_setting` with `older` older chunks, then with none (the same classifiers' newest two)."""
    slow = await one_setting(redis_url, classifiers, older)
    floor = await one_setting(redis_url, classifiers, 0)
    return {"classifiers": classifiers, "chunk_seconds": CHUNK_SECONDS, "items_per_chunk": ITEMS_PER_CHUNK,
            "passes": PASSES, "with_older_chunks": slow, "newest_two_only": floor,
            "vs_newest_two_only": round(slow["ms_per_classifier"] / floor["ms_per_classifier"], 2)}


def run(redis: str | None, classifiers: int, older: int) -> dict:
    """`loop_pass_bench` against `redis`, or an embedded Redis."""
    from contextlib import ExitStack

    from ..embedded import EmbeddedRedis

    with ExitStack() as stack:
        url = redis or stack.enter_context(EmbeddedRedis()).url
        return asyncio.run(loop_pass_bench(url, classifiers, older))
