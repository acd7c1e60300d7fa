"""The difference estimator in the service (`labels.calibrated`): LABEL keeps each label's
stratum, label and score with its chunk; the API and the gauges report the difference
estimator's interval where the switch uses it, with ``calibration`` saying so, for precision and,
from both sides of the threshold, for recall, F1 and accuracy; below
CALIBRATION_MIN_LABELS, with it 0, or with records that do not add up to the chunk's label
counts, exactly today's estimator.  Real Redis; the statistics themselves are
tests/unit/test_difference.py's."""

from __future__ import annotations

import time

import numpy as np
import orjson
import pytest
from redis.asyncio import Redis
from scipy.special import expit

from stratameter.api.views import chunk_view, classifier_view
from stratameter.config import load_settings
from stratameter.ingest.ingestor import ScoreIngestor
from stratameter.labels import calibrated
from stratameter.labels.calibrated import chunk_calibration, chunk_calibrations, fold_of
from stratameter.state.calls import LabelCall
from stratameter.state.keys import negatives_of
from stratameter.state.process import ProcessState
from stratameter.state.store import Store
from stratameter.stats.calibration import resolve_kind
from stratameter.stats.difference import Labelled, StratumGrid, calibrated_interval, calibrated_metrics, feature

pytestmark = pytest.mark.integration

PER_STRATUM = 80


async def _labelled_chunk(redis_url: str, prefix: str, both_sides: bool = False, **env: str):
    """A chunk of a steep classifier (the label's odds climb fast with the score inside every
    stratum) with PER_STRATUM labels in each of its 4 strata, folded through ISSUE and LABEL; with
    `both_sides`, scores over the whole range, threshold 0.5, and the predicted negatives' 4 strata
    labelled too (their request ids ``c~negatives/...``)."""
    settings = load_settings({"STRATAMETER_REDIS_URL": redis_url, **{f"STRATAMETER_{k}": v for k, v in env.items()}})
    redis = Redis.from_url(redis_url)
    store = Store(redis, prefix)
    rng = np.random.default_rng(7)
    n = 40_000 if both_sides else 20_000
    scores = np.round((0.0 if both_sides else 0.5) + (1.0 if both_sides else 0.5) * rng.random(n), 6)
    truth = dict(zip((f"i{j}" for j in range(n)), rng.random(n) < expit(14.0 * (scores - 0.75))))
    now = int(time.time() * 1000)
    ingest = ScoreIngestor(store, settings, np.random.default_rng(0))
    await ingest.apply(0, np.arange(n), ["c"] * n, list(truth), scores, scores >= 0.5, np.full(n, now), [None] * n)
    (t,) = await store.chunks.chunk_ids("c")
    assert await store.registry.acquire_lease("c", "me", 60_000)
    for sid in ["c", negatives_of("c")] if both_sides else ["c"]:
        cs = (await store.chunks.chunk_states(sid, [t]))[0]
        requests = []
        for k, reservoir in enumerate(await store.chunks.reservoirs(sid, t, cs.strata)):
            for j, (member, _) in enumerate(reservoir[:PER_STRATUM]):
                m = orjson.loads(member)
                requests.append([f"{sid}/r{k}-{j}", k, m["i"], repr(float(m["s"])), member])
        issued = await store.requests.issue(sid, t, now, now + 3_600_000, 1, "me", requests, {}, 60_000)
        assert len(issued) == len(requests)
        outcomes = await store.requests.apply_labels([LabelCall(sid, 0, i, r[0], "1" if truth[r[2]] else "0", now,
                                                                "ann") for i, r in enumerate(requests)])
        assert {o.outcome for o in outcomes} == {"accepted"}
    return settings, store, t


async def test_labels_keep_their_score_and_the_view_reports_the_difference_estimator(redis_url, unique_name):
    settings, store, t = await _labelled_chunk(redis_url, unique_name("cal"))
    cfg = settings.for_classifier("c")
    cs = (await store.chunks.chunk_states("c", [t]))[0]
    _, rec = await store.chunks.chunk_labelled("c", t)
    assert rec.stratum.size == 4 * PER_STRATUM == int(cs.n.sum()) and rec.unreadable == 0
    assert int(rec.label.sum()) == int(cs.h.sum())
    # the same computation by hand from what LABEL kept and the histogram INGEST kept
    hist = await store.chunks.chunk_score_histogram("c", t)
    kind = resolve_kind("auto", cs.min, cs.max)
    expected = calibrated_interval(cs.N, Labelled(rec.stratum, feature(rec.score, kind), rec.label,
                                                  [fold_of(r) for r in rec.request_ids]),
                                   StratumGrid.from_histogram(hist, cs.cuts, kind), cfg.confidence, False)
    got = await chunk_calibration(store.chunks, "c", cs, cfg, fpc=False)
    assert got == expected
    assert got.active, "a steep classifier's calibration beats its strata"
    assert got.interval.halfwidth < got.plain.halfwidth
    doc = await classifier_view(store.chunks, ProcessState(), "c", cfg)
    assert doc["calibration"] == {"intercept": got.calibration.intercept, "slope": got.calibration.slope,
                                  "labels_used": 4 * PER_STRATUM, "active": True, "active_metrics": ["precision"]}
    assert (doc["estimate"], doc["ci_lower"], doc["ci_upper"]) == (
        float(got.interval.estimate), float(got.interval.lower), float(got.interval.upper))
    print(f"halfwidth plain {float(got.plain.halfwidth):.4f}, difference {float(got.interval.halfwidth):.4f}")
    assert doc["metrics"]["precision"]["ci_lower"] == doc["ci_lower"]
    # folds are balanced and fixed by the request id
    folds = np.array([fold_of(r) for r in rec.request_ids])
    assert 0.35 < folds.mean() < 0.65 and [fold_of(r) for r in rec.request_ids] == folds.tolist()
    await store.redis.aclose()


async def test_every_metric_from_both_sides_reports_the_difference_estimator(redis_url, unique_name):
    """METRICS=precision,recall,f1,accuracy: one calibration over both sides' labelled items and
    histograms, each metric's interval the one `calibrated_metrics` gives on what LABEL and INGEST
    kept, reported where it is active (and today's elsewhere)."""
    settings, store, t = await _labelled_chunk(redis_url, unique_name("cal2"), both_sides=True,
                                               METRICS="precision,recall,f1,accuracy")
    cfg = settings.for_classifier("c")
    (pos,), (neg,) = await store.chunks.chunk_states("c", [t]), await store.chunks.chunk_states(negatives_of("c"), [t])
    kind = resolve_kind("auto", min(pos.min, neg.min), max(pos.max, neg.max))
    parts, grids = [], []
    for sid, cs, first in (("c", pos, 0), (negatives_of("c"), neg, pos.strata)):
        _, rec = await store.chunks.chunk_labelled(sid, t)
        assert rec.stratum.size == int(cs.n.sum()) == 4 * PER_STRATUM
        parts.append((rec.stratum + first, feature(rec.score, kind), rec.label, [fold_of(r) for r in rec.request_ids]))
        grids.append(StratumGrid.from_histogram(await store.chunks.chunk_score_histogram(sid, t), cs.cuts, kind))
    items = Labelled(*(np.concatenate(col) for col in zip(*parts)))
    N = np.concatenate([pos.N, neg.N])
    metrics = ("precision", "recall", "f1", "accuracy")
    expected = calibrated_metrics(N, np.arange(8) < 4, items, StratumGrid.stack(grids), metrics, cfg.confidence, False)
    got = await chunk_calibrations(store.chunks, [("c", pos, True), (negatives_of("c"), neg, False)], cfg, False,
                                   metrics)
    assert got == expected
    assert got["recall"].active and got["accuracy"].active, "a steep score helps on both sides"
    doc = await classifier_view(store.chunks, ProcessState(), "c", cfg)
    assert doc["calibration"]["active_metrics"] == [m for m in metrics if got[m].active]
    assert doc["calibration"]["labels_used"] == 8 * PER_STRATUM
    for m in metrics:
        reported = got[m].interval
        assert (doc["metrics"][m]["ci_lower"], doc["metrics"][m]["ci_upper"]) == (
            float(reported.lower), float(reported.upper)), m
    await store.redis.aclose()


async def test_off_below_the_minimum_or_with_missing_records_the_estimator_is_todays(redis_url, unique_name):
    settings, store, t = await _labelled_chunk(redis_url, unique_name("cal"))
    cs = (await store.chunks.chunk_states("c", [t]))[0]
    plain = chunk_view(cs, settings.for_classifier("c"), time.time())
    assert plain["calibration"] is None
    for env in ({"STRATAMETER_CALIBRATION_MIN_LABELS": "0"},
                {"STRATAMETER_CALIBRATION_MIN_LABELS": str(4 * PER_STRATUM + 1)}):
        cfg = load_settings({"STRATAMETER_REDIS_URL": redis_url, **env}).for_classifier("c")
        assert await chunk_calibration(store.chunks, "c", cs, cfg, fpc=False) is None
        doc = await classifier_view(store.chunks, ProcessState(), "c", cfg)
        assert doc["calibration"] is None
        assert (doc["estimate"], doc["ci_lower"], doc["ci_upper"]) == (plain["estimate"], plain["ci_lower"],
                                                                       plain["ci_upper"])
    # a label folded before LABEL kept records (here: one record removed) leaves the plain estimator
    cfg = settings.for_classifier("c")
    assert await chunk_calibration(store.chunks, "c", cs, cfg, fpc=False) is not None
    _, rec = await store.chunks.chunk_labelled("c", t)
    await store.redis.hdel(store.keys.chunk_labelled("c", t), rec.request_ids[0])
    calibrated._labelled.clear()  # a process that first reads the chunk now (records are kept by label count)
    assert await chunk_calibration(store.chunks, "c", cs, cfg, fpc=False) is None
    assert (await classifier_view(store.chunks, ProcessState(), "c", cfg))["estimate"] == plain["estimate"]
    await store.redis.aclose()


async def test_a_request_issued_before_scores_were_kept_gives_its_score_from_the_item(redis_url, unique_name):
    """Requests recorded by an earlier version have no ``score`` field: LABEL reads it from the item."""
    settings, store, t = await _labelled_chunk(redis_url, unique_name("cal"))
    now = int(time.time() * 1000)
    member = orjson.dumps({"i": "old-item", "s": 0.8125}).decode()
    assert await store.requests.issue("c", t, now, now + 60_000, 2, "me", [["c/old", 0, "old-item", "0.8125", member]],
                                      {}, 60_000) == ["c/old"]
    await store.redis.hdel(store.keys.request("c", "c/old"), "score")
    (outcome,) = await store.requests.apply_labels([LabelCall("c", 0, 10_000, "c/old", "1", now, "ann")])
    assert outcome.outcome == "accepted"
    raw = await store.redis.hget(store.keys.chunk_labelled("c", t), "c/old")
    assert raw.split() == [b"0", b"1", b"0.8125"]
    await store.redis.aclose()
