"""`api.closed_chunks`: a closed chunk read once is read again whole only after a label came or its
status changed, against a real Redis (the window's older chunks at each scrape, `api.views`)."""

from __future__ import annotations

import numpy as np
import pytest

from stratameter.api.closed_chunks import ClosedChunks, label_mark
from stratameter.config import load_settings
from stratameter.ingest.ingestor import ScoreIngestor
from stratameter.state.store import Store

pytestmark = pytest.mark.integration


async def _one_chunk(store: Store) -> int:
    """300 scores of classifier ``c`` in one one-minute chunk (its id returned)."""
    settings = load_settings({"STRATAMETER_REDIS_URL": "redis://unused", "STRATAMETER_CHUNK_SECONDS": "60"})
    ingest = ScoreIngestor(store, settings, np.random.default_rng(0))
    n = 300
    await ingest.apply(0, np.arange(n), ["c"] * n, [f"i{j}" for j in range(n)], np.random.default_rng(1).random(n),
                       np.ones(n, bool), np.full(n, 1_700_000_000_000), [None] * n)
    return 1_700_000_000 // 60


def _counted(monkeypatch, chunks, method: str) -> list[list[int]]:
    """The chunk ids of every call of `chunks`' read `method` (a state id and chunk ids), in order."""
    calls: list[list[int]] = []
    read = getattr(chunks, method)

    async def counting(sid, ids):
        calls.append(list(ids))
        return await read(sid, ids)

    monkeypatch.setattr(chunks, method, counting)
    return calls


async def test_a_closed_chunk_is_read_whole_again_only_once_its_labels_or_status_change(store: Store, monkeypatch):
    t = await _one_chunk(store)
    whole_reads = _counted(monkeypatch, store.chunks, "chunk_states")
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


async def test_a_closed_chunks_status_change_is_counted(store: Store):
    """SET_STATUS and EVALUATE_ROUND count in the state's counters (``status_changes``) a closed
    chunk's status that changes and the first write that sees the chunk closed, not an open chunk's
    (it may move every step), nor a write of the status it already has: what a scrape's memory of
    closed chunks reads to know that no closed chunk's status moved."""
    t = 1_700_000_000 // 60

    async def changes() -> int:
        return int(await store.redis.hget(store.keys.counters("c"), "status_changes") or 0)

    await store.chunks.set_status("c", t, "open", closed=False)
    await store.chunks.set_status("c", t, "converged", closed=False)  # open: not counted
    assert await changes() == 0
    await store.chunks.set_status("c", t, "converged", closed=True)  # seen closed the first time
    assert await changes() == 1
    await store.chunks.set_status("c", t, "converged", closed=True)  # nothing moved
    assert await changes() == 1
    await store.chunks.set_status("c", t, "open", closed=True)  # a closed chunk's status moved
    assert await changes() == 2
    assert await store.chunks.evaluate_round("c", t, 1, 1, "converged")
    assert await changes() == 3
    assert await store.chunks.evaluate_round("c", t, 2, 2, "converged")  # the same status
    assert not await store.chunks.evaluate_round("c", t, 2, 2, "open")  # already evaluated: nothing
    assert await changes() == 3 and await store.redis.hget(store.keys.chunk_meta("c", t), "status") == b"converged"


async def test_a_closed_chunk_is_not_read_at_all_while_its_states_label_mark_stands(store: Store, monkeypatch):
    """`label_mark`: while the state's counters say no label was folded since a chunk was found
    current, not even its label counts are read; a new mark reads them again (and the chunk whole
    only if they changed)."""
    t = await _one_chunk(store)
    counted = _counted(monkeypatch, store.chunks, "label_counts")
    closed = ClosedChunks()
    first = await closed.states(store.chunks, "c", [t], mark=("3", "100"))
    assert counted == []  # not known yet: read whole
    assert (await closed.states(store.chunks, "c", [t], mark=("3", "100")))[0] is first[0] and counted == []
    assert (await closed.states(store.chunks, "c", [t], mark=("4", "200")))[0] is first[0] and counted == [[t]]
    assert (await closed.states(store.chunks, "c", [t], mark=("4", "200")))[0] is first[0] and counted == [[t]]
    assert (await closed.states(store.chunks, "c", [t]))[0] is first[0] and counted == [[t], [t]]  # no mark
    assert label_mark({"labels_accepted": "4", "last_label_ms": "200", "requests_total": "9",
                       "status_changes": "2"}) == ("4", "200", "2")
