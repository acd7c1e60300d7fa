"""Strata from the start (issue 9): a new classifier on a slow stream opens its first
chunk provisional (one stratum) and gets its K strata once 25 x K of its predicted
positives have arrived; the items counted before that are re-assigned exactly (N from
their exact scores, reservoir members to their strata).  Against a real Redis."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import orjson
import pytest
from redis.asyncio import Redis

from stratameter.config import load_settings
from stratameter.ingest.aggregate import build_payload, group_by_classifier, score_counts
from stratameter.ingest.ingestor import ScoreIngestor, provisional_cap
from stratameter.state.calls import IngestRefusal
from stratameter.state.records import ChunkCuts
from stratameter.state.store import Store
from stratameter.stats.sketch import ScoreHistogram
from stratameter.stats.strata import assign, boundaries
from tests.harness import Reviewer, running_service, wait_for

pytestmark = pytest.mark.integration

CHUNK_S = 3600
K = 4
CAP = 25 * K


def _t0() -> int:
    """An event time inside the current chunk (past, never future)."""
    now = int(time.time() * 1000)
    return now - now % (CHUNK_S * 1000) + 1


# ---------------------------------------------------------------------------------- pure


def test_provisional_cap():
    assert provisional_cap(4, 1024) == 100
    assert provisional_cap(20, 1024) == 500
    assert provisional_cap(4, 64) == 64  # a provisional chunk must fit its one reservoir
    assert provisional_cap(1, 1024) == 0  # one stratum: never provisional


def test_score_counts_are_exact_and_round_trip():
    s = np.array([0.1, 0.7, 0.1, 1e-17, 0.30000000000000004, 0.7, 0.7, -2.5e300])
    pairs = score_counts(s)
    got = {float(v): c for v, c in zip(pairs[0::2], pairs[1::2])}
    assert got == {0.1: 2, 0.7: 3, 1e-17: 1, 0.30000000000000004: 1, -2.5e300: 1}
    assert all(isinstance(v, str) for v in pairs[0::2])


def test_payload_of_a_provisional_chunk_carries_its_version_cap_and_scores():
    t0 = _t0()
    scores = np.array([0.2, 0.9, 0.9, 0.4])
    (recs,) = group_by_classifier(np.arange(4), ["c"] * 4, [f"i{i}" for i in range(4)], scores,
                                  np.array([True, True, True, False]), np.full(4, t0), [None] * 4)
    rng = np.random.default_rng(0)
    prov = build_payload(recs, CHUNK_S, lambda t: ChunkCuts(np.empty(0), 0, True), 1024, 0, rng, cap=100)
    (c,) = prov["chunks"]
    assert (c["v"], c["cap"], c["n"], c["N"]) == (0, 100, 3, [0, 3])
    assert {float(v): n for v, n in zip(c["ps"][0::2], c["ps"][1::2])} == {0.2: 1, 0.9: 2}
    final = build_payload(recs, CHUNK_S, lambda t: ChunkCuts(np.array([0.5]), 1, False), 1024, 0, rng, cap=100)
    (c,) = final["chunks"]
    assert c["v"] == 1 and "ps" not in c and "cap" not in c and c["N"] == [0, 1, 1, 2]


# ---------------------------------------------------------------------------------- helpers


class Feed:
    """Records of one classifier (scores rounded: ties); `args` builds one batch of them."""

    def __init__(self, n: int, seed: int, cid: str = "new") -> None:
        rng = np.random.default_rng(seed)
        self.cid = cid
        self.scores = np.round(rng.beta(2, 2, n), 3)  # rounded: ties, as real scores have
        self.positive = self.scores >= 0.2  # some records are not predicted positive
        self.items = [f"it{i}" for i in range(n)]
        self.t0 = _t0()

    def args(self, part_offsets: np.ndarray, idx: np.ndarray) -> tuple:
        return (part_offsets, [self.cid] * idx.size, [self.items[i] for i in idx], self.scores[idx],
                self.positive[idx], np.full(idx.size, self.t0), [None] * idx.size)


def _spy(store: Store) -> dict[str, list]:
    """Record RESTRATIFY outcomes and INGEST's cuts-guard refusals (their reasons) of `store`; a
    histogram guard's (BINS_CHANGED: two instances adding to one chunk, `ingest.bins`) apart."""
    seen: dict[str, list] = {"restratified": [], "refused": [], "bins_changed": []}
    restratify, apply_ingest = store.chunks.restratify, store.chunks.apply_ingest

    async def spy_restratify(cid, t, version, cuts):
        done = await restratify(cid, t, version, cuts)
        seen["restratified"].append((cid, done))
        return done

    async def spy_apply(calls):
        out = await apply_ingest(calls)
        for reply in out:
            seen["refused"] += [reason for _t, reason in reply.refused if reason != IngestRefusal.BINS_CHANGED]
            seen["bins_changed"] += [t for t, reason in reply.refused if reason == IngestRefusal.BINS_CHANGED]
        return out

    store.chunks.restratify, store.chunks.apply_ingest = spy_restratify, spy_apply
    return seen


@pytest.fixture
def settings(redis_url):
    """The service's settings on the test Redis, with `CHUNK_S`-second chunks."""
    return load_settings({"STRATAMETER_REDIS_URL": redis_url, "STRATAMETER_CHUNK_SECONDS": str(CHUNK_S)})


async def _chunk(store: Store, cid: str):
    ids = await store.chunks.chunk_ids(cid)
    assert len(ids) == 1
    (cs,) = await store.chunks.chunk_states(cid, ids)
    return cs


async def _check_exact(store: Store, cid: str, scores: np.ndarray, records: int) -> np.ndarray:
    """The chunk holds exactly `scores` (the predicted positives sent, with repeats) in its
    final strata, its reservoirs hold every distinct item in the stratum of its score."""
    cs = await _chunk(store, cid)
    assert not cs.provisional and cs.strata == K, cs
    expected = np.bincount(assign(scores, cs.cuts), minlength=K)
    assert cs.N.tolist() == expected.tolist()
    res = await store.chunks.reservoirs(cid, cs.chunk, K)
    members = {}
    for k, entries in enumerate(res):
        for raw, _priority in entries:
            m = orjson.loads(raw)
            assert int(assign(np.array([m["s"]]), cs.cuts)[0]) == k, (m, k, cs.cuts)
            members[m["i"]] = m["s"]
    assert len(members) == sum(len(r) for r in res)  # no member in two strata
    summary = await store.chunks.classifier_summary(cid)
    assert int(summary["meta"]["scores_total"]) == records
    hist = await store.chunks.chunk_score_histogram(cid, cs.chunk)  # the `bins` counters, each score once
    want = ScoreHistogram.from_scores(scores)
    assert (hist.counts.tolist(), hist.min, hist.max) == (want.counts.tolist(), want.min, want.max)
    ck = store.keys.chunk(cid, cs.chunk)
    assert not await store.redis.exists(f"{ck}:pscores")  # dropped once re-stratified
    assert await store.redis.hget(f"{ck}:meta", "cuts_version") == b"1"
    return cs.cuts


# ---------------------------------------------------------------------------------- service state


async def test_slow_stream_gets_its_strata_once_25k_items_arrived(settings, store):
    seen = _spy(store)
    ingest = ScoreIngestor(store, settings, np.random.default_rng(1))
    feed = Feed(240, seed=3)
    feed.items[7] = feed.items[6]  # a repeated record (same item, score): counted twice, one member
    feed.scores[7], feed.positive[7] = feed.scores[6], feed.positive[6]
    sent = 0
    crossed = None
    for b in range(0, 240, 3):  # 3 records per batch
        idx = np.arange(b, b + 3)
        assert await ingest.apply(0, idx, *feed.args(idx, idx)[1:]) == 3
        sent += 3
        positives = int(feed.positive[:sent].sum())
        cs = await _chunk(store, feed.cid)
        if positives < CAP:
            assert cs.provisional and cs.strata == 1 and cs.N.tolist() == [positives], (sent, cs)
        else:
            assert not cs.provisional and cs.strata == K and int(cs.N.sum()) == positives
            if crossed is None:
                crossed = sent
                # the cuts come from every item up to and including the batch that reached 25 K
                pos = feed.scores[:sent][feed.positive[:sent]]
                assert cs.cuts.tolist() == boundaries(ScoreHistogram.from_scores(pos), K, "perc").tolist()
                assert np.all(np.bincount(assign(pos, cs.cuts), minlength=K) >= 10)
    assert crossed is not None and int(feed.positive[:crossed - 3].sum()) < CAP <= int(feed.positive[:crossed].sum())
    assert seen == {"restratified": [(feed.cid, True)], "refused": [IngestRefusal.RESTRATIFY_FIRST],
                    "bins_changed": []}
    cuts = await _check_exact(store, feed.cid, feed.scores[feed.positive], 240)
    res = await store.chunks.reservoirs(feed.cid, (await _chunk(store, feed.cid)).chunk, K)
    assert sum(len(r) for r in res) == int(feed.positive.sum()) - 1  # every distinct item kept (one repeat)

    # a replay after re-stratification (a restart from older committed offsets) is a no-op:
    # the batches before, at and after the crossing, by this instance and by a fresh one
    for ing in (ingest, ScoreIngestor(store, settings, np.random.default_rng(2))):
        for b in (0, 30, crossed - 3, crossed, 237):
            idx = np.arange(b, b + 3)
            assert await ing.submit(await ing.prepare(0, *feed.args(idx, idx), reload_offsets=True)) == 0
    assert (await _check_exact(store, feed.cid, feed.scores[feed.positive], 240)).tolist() == cuts.tolist()


async def test_a_replica_with_stale_cuts_reloads_them(settings, store):
    seen = _spy(store)
    a, b = (ScoreIngestor(store, settings, np.random.default_rng(s)) for s in (1, 2))
    feed = Feed(400, seed=5)
    feed.positive[:] = True
    # b caches the provisional cuts (partition 1), then prepares a batch on them
    assert await b.apply(1, np.arange(3), *feed.args(np.arange(3), np.arange(300, 303))[1:]) == 3
    ahead = await b.prepare(1, *feed.args(np.arange(3, 6), np.arange(303, 306)))
    # a (partition 0) brings the chunk past 25 K in one batch and re-stratifies it
    assert await a.apply(0, np.arange(120), *feed.args(np.arange(120), np.arange(120))[1:]) == 120
    assert not (await _chunk(store, feed.cid)).provisional
    # b's payload was built with the provisional cuts: refused, re-aggregated with the new ones
    assert await b.submit(ahead) == 3
    assert seen == {"restratified": [(feed.cid, True)],
                    "refused": [IngestRefusal.RESTRATIFY_FIRST, IngestRefusal.STALE_CUTS], "bins_changed": []}
    idx = np.concatenate([np.arange(120), np.arange(300, 306)])
    await _check_exact(store, feed.cid, feed.scores[idx], idx.size)


async def test_two_instances_racing_on_one_new_classifier_stay_consistent(settings, store):
    seen = _spy(store)
    replicas = [ScoreIngestor(store, settings, np.random.default_rng(s)) for s in (1, 2)]
    feed = Feed(360, seed=11)
    halves = [np.arange(0, 360, 2), np.arange(1, 360, 2)]  # partition p gets every other record

    async def run(p: int) -> int:
        counted = 0
        idx = halves[p]
        for j in range(0, idx.size, 3):
            part_off = np.arange(j, min(j + 3, idx.size))
            counted += await replicas[p].apply(p, part_off, *feed.args(part_off, idx[part_off])[1:])
            await asyncio.sleep(0)
        return counted

    assert sum(await asyncio.gather(run(0), run(1))) == 360
    await _check_exact(store, feed.cid, feed.scores[feed.positive], 360)
    assert [done for _cid, done in seen["restratified"]].count(True) == 1
    seen["restratified"].clear()
    seen["refused"].clear()

    # both at once, each with a batch that brings the provisional chunk past 25 K: one
    # re-stratification wins, the other instance reloads the cuts and re-aggregates
    feed3 = Feed(300, seed=13, cid="new3")
    feed3.positive[:] = True
    for p in (0, 1):  # each caches the provisional chunk, opened by a small batch
        assert await replicas[p].apply(p, np.arange(2), *feed3.args(np.arange(2), np.arange(2 * p, 2 * p + 2))[1:]) == 2
    preps = [await replicas[p].prepare(p, *feed3.args(np.arange(2, 100), np.arange(4 + 98 * p, 102 + 98 * p)))
             for p in (0, 1)]
    assert sum(await asyncio.gather(*(replicas[p].submit(preps[p]) for p in (0, 1)))) == 196
    await _check_exact(store, "new3", feed3.scores[:200], 200)
    # both batches would cross
    assert sorted(seen["refused"]) == [IngestRefusal.RESTRATIFY_FIRST, IngestRefusal.RESTRATIFY_FIRST]
    assert [done for _cid, done in seen["restratified"]].count(True) == 1, seen


async def _provisional_chunk(settings, store, seed: int):
    """An ingestor, a feed of 200 predicted positives and its chunk, provisional after the first 50."""
    ingest = ScoreIngestor(store, settings, np.random.default_rng(1))
    feed = Feed(200, seed=seed)
    feed.positive[:] = True
    assert await ingest.apply(0, np.arange(50), *feed.args(np.arange(50), np.arange(50))[1:]) == 50
    cs = await _chunk(store, feed.cid)
    assert cs.provisional
    return ingest, feed, cs


async def test_a_provisional_chunk_purged_meanwhile_keeps_one_stratum(settings, store):
    ingest, feed, cs = await _provisional_chunk(settings, store, seed=7)
    # retention purges its reservoir and exact scores (as for a chunk older than CHUNK_RETENTION)
    await store.requests.purge_chunks(feed.cid, [cs.chunk, cs.chunk + 1], keep_full=1, keep_history=10)
    assert await ingest.apply(0, np.arange(50, 150), *feed.args(np.arange(50, 150), np.arange(50, 150))[1:]) == 100
    cs = await _chunk(store, feed.cid)
    assert not cs.provisional and cs.strata == 1 and cs.N.tolist() == [150]


async def test_a_provisional_chunk_frozen_once_closed_keeps_one_stratum_and_counts_exactly(settings, store):
    """FREEZE (the request loop, for a chunk that closed provisional, so that it can be sampled):
    the chunk keeps its one stratum for good; the batch that would have re-stratified it, prepared
    on the provisional cuts before the freeze, is refused as stale and counted exactly in the one
    stratum; a second freeze does nothing, nor does a RESTRATIFY of the old version."""
    ingest, feed, cs = await _provisional_chunk(settings, store, seed=8)
    version = (await store.chunks.chunk_strata([(feed.cid, cs.chunk)]))[(feed.cid, cs.chunk)].version
    late = await ingest.prepare(0, *feed.args(np.arange(50, 150), np.arange(50, 150)))  # on the provisional cuts
    assert await store.chunks.freeze(feed.cid, cs.chunk)
    assert not await store.chunks.freeze(feed.cid, cs.chunk)
    assert await ingest.submit(late) == 100
    cs = await _chunk(store, feed.cid)
    assert not cs.provisional and cs.strata == 1 and cs.N.tolist() == [150]
    assert not await store.chunks.restratify(feed.cid, cs.chunk, version, np.array([0.3, 0.5, 0.7]))
    assert (await _chunk(store, feed.cid)).strata == 1
    assert not await store.redis.exists(store.keys.chunk_pscores(feed.cid, cs.chunk))


async def test_one_stratum_or_a_large_opening_batch_is_never_provisional(redis_url, unique_name):
    redis = Redis.from_url(redis_url)
    feed = Feed(150, seed=9)
    feed.positive[:] = True
    for env, n, strata in (({"STRATAMETER_STRATA": "1"}, 3, 1), ({}, 100, K)):
        settings = load_settings({"STRATAMETER_REDIS_URL": redis_url, "STRATAMETER_CHUNK_SECONDS": str(CHUNK_S),
                                  **env})
        store = Store(redis, unique_name("never"))
        ingest = ScoreIngestor(store, settings, np.random.default_rng(1))
        assert await ingest.apply(0, np.arange(n), *feed.args(np.arange(n), np.arange(n))[1:]) == n
        cs = await _chunk(store, feed.cid)
        assert not cs.provisional and cs.strata == strata
    await redis.aclose()


async def test_restratify_assigns_like_the_core_also_at_the_cuts(settings, store):
    """RESTRATIFY's stratum rule in Lua (number of cuts <= s) is `stats.strata.assign`'s,
    for scores exactly at a cut, repeated scores and tiny or negative ones; it runs once."""
    ingest = ScoreIngestor(store, settings, np.random.default_rng(1))
    scores = np.array([-3.5, 1e-300, 0.1, 0.2, 0.2, 0.30000000000000004, 0.3, 0.7, 0.7, 0.9999999999999999, 12.0])
    n = scores.size
    items = [f"i{i}" for i in range(n)]
    assert await ingest.apply(0, np.arange(n), ["c"] * n, items, scores, np.ones(n, bool), np.full(n, _t0()),
                              [None] * n) == n
    cs = await _chunk(store, "c")
    assert cs.provisional and cs.N.tolist() == [n]
    cuts = np.array([0.2, 0.30000000000000004, 0.7])
    assert await store.chunks.restratify("c", cs.chunk, 0, cuts)
    assert not await store.chunks.restratify("c", cs.chunk, 0, np.array([0.5]))  # done once: version moved
    cs = await _chunk(store, "c")
    assert not cs.provisional and cs.cuts.tolist() == cuts.tolist()
    assert cs.N.tolist() == np.bincount(assign(scores, cuts), minlength=4).tolist() == [3, 3, 1, 4]
    res = await store.chunks.reservoirs("c", cs.chunk, 4)
    got = {orjson.loads(m)["i"]: k for k, entries in enumerate(res) for m, _ in entries}
    assert got == {items[i]: int(k) for i, k in enumerate(assign(scores, cuts))}


async def test_service_slow_stream_new_classifier_gets_k_strata_and_only_final_strata_are_sampled(
        kafka_bootstrap, redis_url, unique_name):
    """Through the broker, with the request loop and a reviewer running: 3 records at a time
    of a new classifier.  Its first chunk is provisional (and never sampled) until 25 x K
    items arrived, then has K strata with exact counts; every label request names the
    final stratum of its item."""
    async with running_service(kafka_bootstrap, redis_url, unique_name, CHUNK_SECONDS=str(CHUNK_S),
                               MAX_LABELS_PER_HOUR="5000") as run:
        store = run.service.store
        feed = Feed(150, seed=21, cid="brand-new")
        feed.positive[:] = True
        seen_provisional = []
        async with Reviewer(run, unique_name("rev"), lambda req: bool(req["score"] > 0.5)) as reviewer:
            for b in range(0, 150, 3):
                for i in range(b, b + 3):
                    await run.send_score(classifier_id=feed.cid, item_id=feed.items[i], score=float(feed.scores[i]),
                                         predicted_positive=True, event_time=feed.t0)
                await run.producer.flush()

                async def counted(n=b + 3):
                    return int((await store.chunks.classifier_summary(feed.cid))["meta"].get("scores_total", 0)) >= n

                await wait_for(counted, 30, f"{b + 3} records counted")
                cs = await _chunk(store, feed.cid)
                seen_provisional.append(cs.provisional)
                assert cs.provisional == (b + 3 < CAP) and cs.strata == (1 if b + 3 < CAP else K), (b, cs)
            cuts = await _check_exact(store, feed.cid, feed.scores, 150)

            async def some_requests():
                return len(reviewer.requests) > 0

            await wait_for(some_requests, 30, "label requests for the re-stratified chunk")
        assert any(seen_provisional) and not seen_provisional[-1]
        for req in reviewer.requests:  # no request while provisional: each names its item's final stratum
            assert req["stratum"] == int(assign(np.array([req["score"]]), cuts)[0]), (req, cuts)


async def test_the_stored_histogram_of_real_valued_scores_round_trips(settings, store):
    """Margins and logits on both sides of 0, extremes included: the `bins` counters (the grid
    rotated by half, `state.records.BINS_ROTATION`) read back as the scores' histogram."""
    scores = np.array([-1e300, -40.0, -3.25, -0.1, -1e-12, 0.0, 0.0, 1e-12, 0.5, 0.999, 7.5, 1e300])
    n = scores.size
    ingest = ScoreIngestor(store, settings, np.random.default_rng(1))
    assert await ingest.apply(0, np.arange(n), ["margins"] * n, [f"i{i}" for i in range(n)], scores,
                              np.ones(n, dtype=bool), np.full(n, _t0()), [None] * n) == n
    (t,) = await store.chunks.chunk_ids("margins")
    hist, want = await store.chunks.chunk_score_histogram("margins", t), ScoreHistogram.from_scores(scores)
    assert (hist.counts.tolist(), hist.min, hist.max) == (want.counts.tolist(), want.min, want.max)
    assert hist.counts[0] == 1 and hist.counts[-1] == 1  # the two extreme buckets


async def test_service_a_chunk_that_closes_provisional_is_sampled_in_its_one_stratum(
        kafka_bootstrap, redis_url, unique_name):
    """A classifier with fewer than 25 x K predicted positives a chunk (60 here, K = 4): its
    chunk stays provisional while open and was never sampled, so it got no estimate at all.
    Once the chunk closes the loop keeps it in its one stratum (FREEZE) and samples it like
    any chunk: label requests for stratum 0, then an estimate and interval for that chunk."""
    chunk_s, n = 20, 60
    async with running_service(kafka_bootstrap, redis_url, unique_name, CHUNK_SECONDS=str(chunk_s),
                               ALLOWED_LATENESS_SECONDS="2", MAX_LABELS_PER_HOUR="5000") as run:
        now = int(time.time() * 1000)
        if now % (chunk_s * 1000) > (chunk_s - 5) * 1000:  # not at the very end of a chunk: all in one
            await asyncio.sleep(6)
            now = int(time.time() * 1000)
        rng = np.random.default_rng(4)
        scores = rng.uniform(0.5, 1.0, n)
        for i, s in enumerate(scores):
            await run.send_score(classifier_id="slow", item_id=f"i{i}", score=float(s), predicted_positive=True,
                                 event_time=now)
        chunk = now // (chunk_s * 1000)
        store = run.service.store

        async def counted():
            return int((await store.chunks.classifier_summary("slow"))["meta"].get("scores_total", 0)) >= n

        await wait_for(counted, 30, "the records counted")
        assert (await _chunk(store, "slow")).provisional
        async with Reviewer(run, unique_name("rev"), lambda req: bool(scores[int(req["item_id"][1:])] > 0.7)
                            ) as reviewer:
            async def estimated():
                status, body = await run.get("/v1/classifiers/slow")
                doc = orjson.loads(body) if status == 200 else None
                mine = [c for c in ([doc] + doc.get("history", []) if doc else [])
                        if c["chunk"]["start"] == _iso_ms(chunk * chunk_s * 1000)]
                return mine[0] if mine and mine[0]["ci_lower"] is not None else None

            doc = await wait_for(estimated, chunk_s + 40, "an estimate of the chunk that closed provisional")
        assert reviewer.requests and {r["stratum"] for r in reviewer.requests} == {0}
        assert doc["closed"] and doc["population"] == n and len(doc["strata"]) == 1 and doc["labels"] >= 2
        assert 0 <= doc["ci_lower"] <= doc["estimate"] <= doc["ci_upper"] <= 1
        cs = await _chunk(store, "slow")
        assert not cs.provisional and cs.strata == 1 and cs.N.tolist() == [n]


def _iso_ms(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000)) + ".000Z"
