"""The request loop with older chunks awaiting slow reviewers, against a real Redis: a step reads
each pending request's chunk once, not on every step, and an older closed chunk that waits for
its answers is not read again until one of them comes (or expires); then it is stepped as before."""

from __future__ import annotations

import time

import numpy as np
import pytest

from stratameter.config import load_settings
from stratameter.ingest.ingestor import ScoreIngestor
from stratameter.requests.loop import RequestLoop
from stratameter.state.calls import LabelCall
from stratameter.state.process import ProcessState
from stratameter.state.store import Store

pytestmark = pytest.mark.integration

CHUNK_S = 60


@pytest.fixture(autouse=True)
def clock(monkeypatch) -> list[float]:
    """`time.time` held 5 s into the current chunk.  With the real clock a run that crossed a
    chunk's end (60 s chunks) changed which chunks are the newest two and failed: checked by
    moving the clock so the end fell 0.02-0.8 s into the run, which failed 5 of 8 times."""
    now = [int(time.time()) // CHUNK_S * CHUNK_S + 5.0]
    monkeypatch.setattr(time, "time", lambda: now[0])
    return now


async def _closed_chunks_and_the_current(store: Store, settings, cid: str, chunks: int) -> int:
    """`chunks` closed chunks and the current one, 400 predicted positives each; returns the
    current chunk's id."""
    ingest = ScoreIngestor(store, settings, np.random.default_rng(0))
    rng = np.random.default_rng(1)
    now_t = int(time.time()) // CHUNK_S
    for j, t in enumerate(range(now_t - chunks, now_t + 1)):
        n = 400
        await ingest.apply(0, np.arange(j * n, (j + 1) * n), [cid] * n, [f"i{t}-{k}" for k in range(n)],
                           0.5 + rng.random(n) / 2, np.ones(n, bool), np.full(n, t * CHUNK_S * 1000 + 1000),
                           [None] * n)
    return now_t


async def test_an_older_chunk_waiting_for_answers_is_read_again_only_once_one_comes(store):
    settings = load_settings({"STRATAMETER_REDIS_URL": "redis://unused", "STRATAMETER_CHUNK_SECONDS": str(CHUNK_S),
                              "STRATAMETER_ALLOWED_LATENESS_SECONDS": "0", "STRATAMETER_INSTANCE_ID": "me",
                              "STRATAMETER_MAX_LABELS_PER_HOUR": "100000"})
    cid = "slow"
    now_t = await _closed_chunks_and_the_current(store, settings, cid, chunks=4)
    published: list = []

    async def publish(records):
        published.extend(records)

    loop = RequestLoop(store, ProcessState(), settings, publish)
    assert await store.registry.acquire_lease(cid, "me", 600_000)
    assert await loop.step(cid) > 0
    by_chunk = await store.requests.pending_by_chunk(cid)
    older = list(range(now_t - 4, now_t - 1))  # before the newest two started chunks
    assert all(by_chunk.get(t, 0) > 0 for t in older), by_chunk  # every older chunk asked for a round
    assert await loop.step(cid) == 0  # everything waits for answers: from now on the older chunks are quiet

    read_chunks: list[list[int]] = []
    request_reads: list[list[str]] = []
    chunks, hgets = store.chunks.chunk_states, store.connection.hgets

    async def spying_chunks(sid, ids):
        read_chunks.append(list(ids))
        return await chunks(sid, ids)

    async def spying_hgets(keys, field):
        request_reads.append(keys)
        return await hgets(keys, field)

    store.chunks.chunk_states, store.connection.hgets = spying_chunks, spying_hgets
    assert await loop.step(cid) == 0
    assert read_chunks == [[now_t - 1, now_t]]  # the newest two only: the older ones are quiet
    assert request_reads == []  # no pending request's chunk read again

    # one answer to a request of the oldest chunk: that chunk is read again, and only it
    rid, h = next((rid, h) for rid, h in await _pending_requests(store, cid) if int(h["chunk"]) == older[0])
    offsets = iter(range(1_000))
    answer = [LabelCall(cid, 0, next(offsets), rid, "1", int(time.time() * 1000), "rev")]
    assert (await store.requests.apply_labels(answer))[0].outcome == "accepted"
    read_chunks.clear()
    await loop.step(cid)
    assert read_chunks == [[now_t - 1, now_t], [older[0]]]

    # its whole round answered: the chunk evaluates the round and asks for the next
    for rid, h in await _pending_requests(store, cid):
        if int(h["chunk"]) == older[0]:
            await store.requests.apply_labels([LabelCall(cid, 0, next(offsets), rid, "1", int(time.time() * 1000),
                                                         "rev")])
    before = len(published)
    assert await store.requests.pending_by_chunk(cid) == {t: c for t, c in by_chunk.items() if t != older[0]}
    assert await loop.step(cid) > 0
    assert len(published) > before
    assert (await store.requests.pending_by_chunk(cid)).get(older[0], 0) > 0
    state = {cs.chunk: cs for cs in await chunks(cid, [older[0]])}[older[0]]
    assert state.evaluated_round > 0


async def _pending_requests(store: Store, cid: str) -> list[tuple[str, dict]]:
    rids = [r.decode() for r in await store.redis.zrange(store.keys.pending(cid), 0, -1)]
    out = []
    for rid in rids:
        h = await store.redis.hgetall(store.keys.request(cid, rid))
        out.append((rid, {k.decode(): v.decode() for k, v in h.items()}))
    return out
