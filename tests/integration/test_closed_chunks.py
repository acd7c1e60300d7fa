"""`api.closed_chunks`: a closed chunk read once is read again whole only after a label came or its
status changed, against a real Redis (the window's older chunks at each scrape, `api.views`)."""

from __future__ import annotations

import numpy as np
import pytest

from stratameter.api.closed_chunks import ClosedChunks
from stratameter.config import load_settings
from stratameter.ingest.ingestor import ScoreIngestor
from stratameter.state.store import Store

pytestmark = pytest.mark.integration


async def test_a_closed_chunk_is_read_whole_again_only_once_its_labels_or_status_change(store: Store, monkeypatch):
    settings = load_settings({"STRATAMETER_REDIS_URL": "redis://unused", "STRATAMETER_CHUNK_SECONDS": "60"})
    ingest = ScoreIngestor(store, settings, np.random.default_rng(0))
    n = 300
    await ingest.apply(0, np.arange(n), ["c"] * n, [f"i{j}" for j in range(n)], np.random.default_rng(1).random(n),
                       np.ones(n, bool), np.full(n, 1_700_000_000_000), [None] * n)
    t = 1_700_000_000 // 60
    whole_reads = []
    read_whole = store.chunks.chunk_states

    async def counting(sid, ids):
        whole_reads.append(list(ids))
        return await read_whole(sid, ids)

    monkeypatch.setattr(store.chunks, "chunk_states", counting)
    closed = ClosedChunks()
    first = await closed.states(store.chunks, "c", [t, t + 5])  # t + 5: never opened
    assert [cs.chunk for cs in first] == [t] and whole_reads == [[t, t + 5]]
    again = await closed.states(store.chunks, "c", [t])
    assert whole_reads[-1] == [] and again[0] is first[0]  # its label counts unchanged: not read whole
    await store.redis.hincrby(store.keys.chunk_labels("c", t), "1", 1)  # what LABEL does with an answer
    await store.redis.hincrby(store.keys.chunk_positives("c", t), "1", 1)
    third = await closed.states(store.chunks, "c", [t])
    assert whole_reads[-1] == [t] and third[0].n[1] == first[0].n[1] + 1 and third[0].h[1] == first[0].h[1] + 1
    await store.chunks.set_status("c", t, "converged", closed=True)  # the loop's verdict, no label
    fourth = await closed.states(store.chunks, "c", [t])
    assert whole_reads[-1] == [t] and fourth[0].status == "converged" != third[0].status
    await closed.states(store.chunks, "c", [t])
    assert whole_reads[-1] == []
    small = ClosedChunks(size=1)
    await small.states(store.chunks, "c", [t])
    await small.states(store.chunks, "d", [t])  # no such state: nothing kept, nothing evicted
    assert len(small._states) == 1
