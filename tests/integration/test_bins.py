"""The histogram's writes (`ingest.bins`): a batch's counters go as runs of their old and new
bytes, which INGEST checks and copies, or as BITFIELD increments; either way Redis ends up with
exactly the counts, and a copy that no longer matches Redis is refused and redone."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stratameter.config import load_settings
from stratameter.ingest.bins import (COUNTER_MAX, RUN_GAP, ChunkBins, counter_runs, histogram_increments)
from stratameter.ingest.ingestor import ScoreIngestor
from stratameter.state.calls import ChunkRefusal, IngestCall, IngestRefusal, IngestReply
from stratameter.state.records import BINS_ROTATION, histogram_counts
from stratameter.state.scripts import encode_ingest
from stratameter.stats.sketch import BINS, bin_index

T0 = 1_800_000_000_000  # every record of these tests falls in one 1 h chunk
CHUNK = T0 // 3_600_000


def _counters(*values: int) -> bytes:
    return np.array(values, dtype=">u4").tobytes()


# ---------------------------------------------------------------------------------- pure


def test_histogram_increments_are_bitfield_arguments():
    buckets, counts = np.array([0, 2047, 2048, BINS - 1]), np.array([3, 1, 7, 2])
    assert histogram_increments(buckets, counts) == [
        "INCRBY", "u32", f"#{BINS_ROTATION}", 3, "INCRBY", "u32", f"#{BINS - 1}", 1,
        "INCRBY", "u32", "#0", 7, "INCRBY", "u32", f"#{BINS_ROTATION - 1}", 2]


def test_counter_runs_split_where_the_gap_is_wider_than_run_gap():
    positions = np.array([0, 1, 5, 5 + RUN_GAP, 6 + 3 * RUN_GAP, 7 + 3 * RUN_GAP])
    assert counter_runs(positions) == [(0, 5 + RUN_GAP), (6 + 3 * RUN_GAP, 7 + 3 * RUN_GAP)]


def test_a_dense_batch_is_one_run_of_old_and_new_bytes():
    copy = ChunkBins(_counters(2))  # counter 0 (bucket 2048, score 0) holds 2; the string ends there
    out = copy.add(np.array([2048, 2049, 2050, 2052, 2053, 2054, 2055, 2056]), np.array([3, 1, 1, 2, 1, 1, 1, 1]))
    assert out == {"runs": [[0, _counters(2, 0, 0, 0, 0, 0, 0, 0, 0), _counters(5, 1, 1, 0, 2, 1, 1, 1, 1)]]}
    assert copy.counts.tolist() == [5, 1, 1, 0, 2, 1, 1, 1, 1]


def test_a_few_counters_go_as_increments():
    copy = ChunkBins()
    out = copy.add(np.arange(2048, 2055), np.ones(7, int))  # 7 < 2 x MIN_TOUCHED_PER_RUN
    assert out == {"hist": histogram_increments(np.arange(2048, 2055), np.ones(7, int))}
    assert copy.counts.tolist() == [1] * 7


def test_scattered_counters_go_as_increments_and_the_copy_follows():
    copy = ChunkBins()
    buckets, counts = np.array([100, 2048, 3000]), np.array([1, 2, 3])
    assert copy.add(buckets, counts) == {"hist": histogram_increments(buckets, counts)}
    want = np.zeros(BINS, np.uint32)
    want[(buckets + BINS_ROTATION) % BINS] = counts
    assert copy.counts.tolist() == want[:2149].tolist()  # as long as its highest counter: bucket 100's


def test_a_counter_saturates_as_bitfield_overflow_sat_does():
    copy = ChunkBins(_counters(COUNTER_MAX - 1, *[7] * 7))
    out = copy.add(np.arange(2048, 2056), np.array([5] + [1] * 7))
    assert out["runs"][0][2] == _counters(COUNTER_MAX, *[8] * 7)


def _apply_like_ingest(stored: bytearray, out: dict) -> bool:
    """What INGEST does with `out` on a ``bins`` string: False where its guard refuses."""
    for offset, old, new in out.get("runs", []):
        current = bytes(stored[offset:offset + len(old)]).ljust(len(old), b"\0")
        if current != old:
            return False
    hist = out.get("hist", [])
    for _incrby, _u32, counter, count in zip(hist[0::4], hist[1::4], hist[2::4], hist[3::4]):
        at = 4 * int(counter[1:])
        stored.extend(b"\0" * max(0, at + 4 - len(stored)))
        value = min(int.from_bytes(stored[at:at + 4], "big") + count, COUNTER_MAX)
        stored[at:at + 4] = value.to_bytes(4, "big")
    for offset, _old, new in out.get("runs", []):
        stored.extend(b"\0" * max(0, offset - len(stored)))
        stored[offset:offset + len(new)] = new
    return True


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=300), min_size=1, max_size=6),
       st.lists(st.integers(0, COUNTER_MAX), max_size=40))
def test_redis_holds_exactly_the_counts_whatever_the_batches(batches, start):
    """Any batches (probabilities, margins around the string's wrap, a few scores or many) from
    any stored string: every write passes the guard, and the string INGEST leaves is the copy
    and the counts, saturated."""
    stored = bytearray(_counters(*start))
    copy = ChunkBins(bytes(stored))
    want = np.zeros(BINS, np.uint64)
    want[:len(start)] = start
    for scores in batches:
        buckets, counts = np.unique(bin_index(np.array(scores)), return_counts=True)
        assert _apply_like_ingest(stored, copy.add(buckets, counts))
        at = (buckets + BINS_ROTATION) % BINS
        want[at] = np.minimum(want[at] + counts, COUNTER_MAX)
    assert bytes(stored).ljust(4 * BINS, b"\0") == want.astype(">u4").tobytes()
    assert copy.counts.astype(">u4").tobytes().ljust(4 * BINS, b"\0") == want.astype(">u4").tobytes()


def test_a_copy_behind_the_stored_string_is_refused():
    stored = bytearray(_counters(*[1] * 8))
    behind = ChunkBins(_counters(1, 1, 0, *[1] * 5))  # read before another writer added to counter 2
    assert not _apply_like_ingest(stored, behind.add(np.arange(2048, 2056), np.ones(8, int)))


# ------------------------------------------------------------------ against a real Redis


def _records(first: int, scores: np.ndarray, cid: str = "c"):
    n = scores.size
    offsets = np.arange(first, first + n)
    return (offsets, [cid] * n, [f"i{o}" for o in offsets], scores, np.ones(n, bool), np.full(n, T0 + 1), [None] * n)


async def _stored_counts(store, cid: str = "c") -> np.ndarray:
    return histogram_counts(await store.redis.get(store.keys.chunk_bins(cid, CHUNK)), {})


def _truth(*scores: np.ndarray) -> np.ndarray:
    return np.bincount(bin_index(np.concatenate(scores)), minlength=BINS)


def _spy_refusals(store) -> list[IngestRefusal]:
    seen: list[IngestRefusal] = []
    apply_ingest = store.chunks.apply_ingest

    async def spy(calls):
        out = await apply_ingest(calls)
        seen.extend(refusal.reason for reply in out for refusal in reply.refused)
        return out

    store.chunks.apply_ingest = spy
    return seen


@pytest.mark.integration
async def test_ingest_refuses_a_stale_copy_and_applies_nothing(redis_url, store):
    settings_ = load_settings({"STRATAMETER_REDIS_URL": redis_url})
    ingest = ScoreIngestor(store, settings_, np.random.default_rng(0))
    first = np.linspace(0.5, 0.9, 400)
    assert await ingest.apply(0, *_records(0, first)) == 400
    stale = ChunkBins()  # as read before the first batch
    buckets = np.arange(3000, 3010)
    payload = {"scores": 10, "now": 0, "last_event": T0 + 1, "res_size": 64, "sample_cap": 4,
               "chunks": [{"t": str(CHUNK), "N": [0, 10], "res": [], "v": 0, **stale.add(buckets, np.ones(10, int))}]}
    assert "runs" in payload["chunks"][0]
    before = await store.redis.hget(store.keys.meta("c"), "scores_total")
    (out,) = await store.chunks.apply_ingest([IngestCall("c", 0, 399, 409, encode_ingest(payload))])
    assert out == IngestReply(False, 399, [], [ChunkRefusal(CHUNK, IngestRefusal.BINS_CHANGED)])
    assert await store.redis.hget(store.keys.meta("c"), "scores_total") == before
    assert (await _stored_counts(store)).tolist() == _truth(first).tolist()


@pytest.mark.integration
async def test_two_instances_adding_to_one_chunk_count_every_score_once(redis_url, store):
    """Replicas A and B own a partition each of one classifier (its key spread over two
    partitions); their batches interleave, each prepared while the other's is applied, so each
    copy of the histogram goes stale in turn: every stale call is refused and redone, and
    Redis holds exactly the counts."""
    settings_ = load_settings({"STRATAMETER_REDIS_URL": redis_url})
    seen = _spy_refusals(store)
    replicas = [ScoreIngestor(store, settings_, np.random.default_rng(s)) for s in (1, 2)]
    rng = np.random.default_rng(3)
    sent: list[np.ndarray] = []

    async def run(p: int) -> int:
        counted, offset = 0, 0
        for _ in range(8):
            scores = rng.beta(2, 2, 150)
            sent.append(scores)
            prepared = await replicas[p].prepare(p, *_records(offset, scores))
            offset += scores.size
            await asyncio.sleep(0)
            counted += await replicas[p].submit(prepared)
        return counted

    assert sum(await asyncio.gather(run(0), run(1))) == 2400
    assert (await _stored_counts(store)).tolist() == _truth(*sent).tolist()
    assert int(await store.redis.hget(store.keys.meta("c"), "scores_total")) == 2400
    assert IngestRefusal.BINS_CHANGED in seen  # the guard did refuse (else this test shows nothing)


@pytest.mark.integration
async def test_increments_from_an_older_writer_are_kept(redis_url, store):
    """An instance of the version before (increments only) adds to the chunk between two of
    this ingestor's batches: the next batch's copy is behind, refused, read again and redone."""
    settings_ = load_settings({"STRATAMETER_REDIS_URL": redis_url})
    seen = _spy_refusals(store)
    ingest = ScoreIngestor(store, settings_, np.random.default_rng(0))
    first, older, last = np.linspace(0.5, 0.7, 300), np.linspace(0.6, 0.8, 50), np.linspace(0.55, 0.75, 300)
    assert await ingest.apply(0, *_records(0, first)) == 300
    buckets, counts = np.unique(bin_index(older), return_counts=True)
    payload = {"scores": 50, "now": 0, "last_event": T0 + 1, "res_size": 64, "sample_cap": 4,
               "chunks": [{"t": str(CHUNK), "N": [0, 50], "res": [], "v": 0,
                           "hist": histogram_increments(buckets, counts)}]}
    (out,) = await store.chunks.apply_ingest([IngestCall("c", 1, -1, 49, encode_ingest(payload))])
    assert out.applied
    assert await ingest.apply(0, *_records(300, last)) == 300
    assert seen == [IngestRefusal.BINS_CHANGED]
    assert (await _stored_counts(store)).tolist() == _truth(first, older, last).tolist()
