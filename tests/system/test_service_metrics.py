"""Recall, F1 and accuracy end to end (STRATAMETER_METRICS), against the real broker and Redis:
the service samples the predicted negatives too, each label is folded once on its side, and
every enabled metric's interval covers the truth computed from the ground truth."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import orjson
import pytest
from scipy.special import expit

from stratameter.simulate.whole_populations import whole_builtin
from stratameter.stats.confusion import METRICS
from tests.harness import Reviewer, running_service, wait_for

pytestmark = pytest.mark.integration

ITEMS = 4000


def population(seed: int = 5):
    """A whole stream with 5 % prevalence: probabilities, threshold 0.5."""
    rng = np.random.default_rng(seed)
    y = (rng.random(ITEMS) < 0.05).astype(int)
    score = expit(np.where(y == 1, rng.normal(1.5, 1.3, ITEMS), rng.normal(-2.5, 1.3, ITEMS)))
    return score, y


def truth_of(score, y) -> dict[str, float]:
    pred, pos = score >= 0.5, y == 1
    tp, fp, fn, tn = (int(np.sum(pred & pos)), int(np.sum(pred & ~pos)), int(np.sum(~pred & pos)),
                      int(np.sum(~pred & ~pos)))
    return {"precision": tp / (tp + fp), "recall": tp / (tp + fn), "f1": 2 * tp / (2 * tp + fp + fn),
            "accuracy": (tp + tn) / ITEMS}


async def test_all_four_metrics_converge_and_cover_the_truth(kafka_bootstrap, redis_url, unique_name):
    score, y = population()
    truth = truth_of(score, y)
    settings = {"DELTA": "0.1", "CONFIDENCE": "0.999", "MAX_LABELS_PER_HOUR": "20000",
                "METRICS": "precision,recall,f1,accuracy"}
    async with running_service(kafka_bootstrap, redis_url, unique_name, **settings) as run:
        now_ms = int(time.time() * 1000)
        for i, s in enumerate(score):
            await run.send_score(classifier_id="fraud", item_id=f"i{i}", score=float(s), event_time=now_ms)
        answered: dict[str, int] = {}

        async def answer(req):
            i = int(req["item_id"][1:])
            assert req["predicted_positive"] == bool(score[i] >= 0.5)
            assert (req["stratum"] >= 4) == (not req["predicted_positive"])
            answered[req["request_id"]] = answered.get(req["request_id"], 0) + 1
            if len(answered) % 40 == 7 and not req["predicted_positive"]:  # answered twice: a duplicate
                await run.send_label(req["request_id"], bool(y[i]))
            return bool(y[i])

        async def converged():
            status, body = await run.get("/v1/classifiers/fraud")
            doc = orjson.loads(body) if status == 200 else None
            return doc if doc and doc["status"] == "converged" else None

        async with Reviewer(run, unique_name("rev"), answer) as reviewer:
            doc = await wait_for(converged, 150, "the four metrics to converge")
        assert doc["scores"] == ITEMS and doc["population"] == ITEMS
        assert set(doc["metrics"]) == set(METRICS)
        for m, iv in doc["metrics"].items():
            assert iv["ci_upper"] - iv["ci_lower"] <= 2 * 0.1 + 1e-9, (m, iv)
            assert iv["ci_lower"] <= truth[m] <= iv["ci_upper"], (m, truth[m], iv)
        assert doc["metrics"]["precision"]["estimate"] == doc["estimate"]
        sides = {s["stratum"]: s["side"] for s in doc["strata"]}
        assert {k for k, side in sides.items() if side == "negative"} == {4, 5, 6, 7}
        assert sum(s["items"] for s in doc["strata"] if s["side"] == "positive") == int(np.sum(score >= 0.5))
        labels_on_negatives = sum(s["labels"] for s in doc["strata"] if s["side"] == "negative")
        assert labels_on_negatives > 0
        assert doc["labels"] == sum(s["labels"] for s in doc["strata"])
        assert doc["labels_by_outcome"]["accepted"] == doc["labels"]
        assert doc["labels_by_outcome"]["duplicate"] >= 1  # a negative's second answer is not folded again
        assert any(not r["predicted_positive"] for r in reviewer.requests)
        status, body = await run.get("/metrics")
        text = body.decode()
        for m in ("recall", "f1", "accuracy"):
            for suffix in ("", "_ci_lower", "_ci_upper", "_stderr"):
                assert f'stratameter_{m}{suffix}_ratio{{classifier="fraud"}}' in text, (m, suffix)
        status, body = await run.get("/v1/classifiers")
        assert orjson.loads(body) == ["fraud"]  # the negatives' state is not a classifier


async def test_multiclass_accuracy_recipe(kafka_bootstrap, redis_url, unique_name):
    """Score = the model's confidence in its predicted class, every record predicted positive,
    label = the prediction was right, METRICS=accuracy (docs/how-to/simulate.md "Multi-class accuracy")."""
    rng = np.random.default_rng(9)
    confidence = 0.2 + 0.8 * rng.random(2000)
    right = rng.random(2000) < confidence
    settings = {"DELTA": "0.08", "CONFIDENCE": "0.999", "MAX_LABELS_PER_HOUR": "20000", "METRICS": "accuracy"}
    async with running_service(kafka_bootstrap, redis_url, unique_name, **settings) as run:
        now_ms = int(time.time() * 1000)
        for i, c in enumerate(confidence):
            await run.send_score(classifier_id="tagger", item_id=f"i{i}", score=float(c), predicted_positive=True,
                                 event_time=now_ms)

        async def converged():
            status, body = await run.get("/v1/classifiers/tagger")
            doc = orjson.loads(body) if status == 200 else None
            return doc if doc and doc["status"] == "converged" else None

        async with Reviewer(run, unique_name("rev"), lambda req: bool(right[int(req["item_id"][1:])])):
            doc = await wait_for(converged, 90, "accuracy to converge")
    acc = doc["metrics"]["accuracy"]
    assert list(doc["metrics"]) == ["accuracy"]
    assert acc["ci_lower"] <= right.mean() <= acc["ci_upper"]
    assert acc["ci_upper"] - acc["ci_lower"] <= 2 * 0.08 + 1e-9
    assert all(s["side"] == "positive" for s in doc["strata"]) and doc["population"] == 2000


async def test_predicted_negatives_before_any_positive_are_sampled_for_recall(kafka_bootstrap, redis_url, unique_name):
    """A whole stream whose chunk gets predicted negatives only for a while (the rare-positive
    classifier of the demo): once they are stratified, the loop samples them for recall while
    precision stays undefined (null, no population), and the chunk's positives are sampled once
    they come.  Before, every step of that chunk raised "the population is empty" (precision's
    interval over no predicted positive): no request, a request_loop failure counted each pass."""
    rng = np.random.default_rng(3)
    negatives = 300
    y_neg = rng.random(negatives) < 0.1
    score_neg = rng.uniform(0.0, 0.5, negatives)
    settings = {"DELTA": "0.15", "CONFIDENCE": "0.95", "MAX_LABELS_PER_HOUR": "20000",
                "METRICS": "precision,recall", "CALIBRATION_MIN_LABELS": "20"}
    async with running_service(kafka_bootstrap, redis_url, unique_name, **settings) as run:
        now_ms = int(time.time() * 1000)
        for i, s in enumerate(score_neg):
            await run.send_score(classifier_id="rare", item_id=f"n{i}", score=float(s), predicted_positive=False,
                                 event_time=now_ms)

        async def answer(req):
            i = int(req["item_id"][1:])
            return bool(y_neg[i]) if req["item_id"][0] == "n" else bool(i % 4)

        async def doc_with(cond):
            status, body = await run.get("/v1/classifiers/rare")
            doc = orjson.loads(body) if status == 200 else None
            return doc if doc and cond(doc) else None

        async with Reviewer(run, unique_name("rev"), answer) as reviewer:
            doc = await wait_for(lambda: doc_with(lambda d: d["metrics"]["recall"]["ci_lower"] is not None), 60,
                                 "labels on the predicted negatives and a recall interval")
            assert doc["labels"] > 0 and all(not r["predicted_positive"] for r in reviewer.requests)
            assert doc["metrics"]["precision"] == {"estimate": None, "ci_lower": None, "ci_upper": None,
                                                   "stderr": None}
            assert doc["estimate"] is None
            status, body = await run.get("/metrics")
            assert status == 200
            failures = [line for line in body.decode().splitlines()
                        if line.startswith("stratameter_classifier_failures_total{")]
            assert failures and all(line.endswith(" 0.0") for line in failures), failures
            for i in range(150):  # past the 25 x K items that stratify the positives (`_sampled_sides`)
                await run.send_score(classifier_id="rare", item_id=f"p{i}", score=float(rng.uniform(0.5, 1.0)),
                                     predicted_positive=True, event_time=now_ms)
            doc = await wait_for(lambda: doc_with(lambda d: d["metrics"]["precision"]["ci_lower"] is not None), 60,
                                 "a precision interval once predicted positives have come")
            assert any(r["predicted_positive"] for r in reviewer.requests)
        assert doc["estimate"] == doc["metrics"]["precision"]["estimate"]
        status, body = await run.get("/metrics")
        failures = [line for line in body.decode().splitlines()
                    if line.startswith("stratameter_classifier_failures_total{")]
        assert failures and all(line.endswith(" 0.0") for line in failures), failures


async def test_negatives_are_sampled_while_the_positives_are_too_few_for_strata(kafka_bootstrap, redis_url,
                                                                                  unique_name):
    """A rare-positive chunk whose predicted positives came first but are fewer than 25 x K (still
    provisional, one stratum): its predicted negatives are sampled meanwhile, the positives held
    (no request, no interval yet, never converged), until the positives get their strata and are
    sampled too.  Before, the loop sampled neither side from the chunk's first predicted positive
    to its 100th: on a slow stream no label all chunk long."""
    rng = np.random.default_rng(4)
    negatives, first_positives = 300, 20
    y_neg = rng.random(negatives) < 0.1
    settings = {"DELTA": "0.05", "CONFIDENCE": "0.95", "MAX_LABELS_PER_HOUR": "20000", "METRICS": "precision,recall"}
    async with running_service(kafka_bootstrap, redis_url, unique_name, **settings) as run:
        store = run.service.store
        now_ms = int(time.time() * 1000)

        async def send_positives(start, count):
            for i in range(start, start + count):
                await run.send_score(classifier_id="rare", item_id=f"p{i}", score=float(rng.uniform(0.5, 1.0)),
                                     predicted_positive=True, event_time=now_ms)

        async def counted(n):
            return int((await store.chunks.classifier_summary("rare"))["meta"].get("scores_total", 0)) >= n

        async def positives_provisional():
            (t,) = await store.chunks.chunk_ids("rare")
            (cs,) = await store.chunks.chunk_states("rare", [t])
            return cs.provisional

        await send_positives(0, first_positives)
        await wait_for(lambda: counted(first_positives), 30, "the first positives counted")
        for i, s in enumerate(rng.uniform(0.0, 0.5, negatives)):
            await run.send_score(classifier_id="rare", item_id=f"n{i}", score=float(s), predicted_positive=False,
                                 event_time=now_ms)
        await wait_for(lambda: counted(first_positives + negatives), 30, "the negatives counted")

        async def answer(req):
            i = int(req["item_id"][1:])
            return bool(y_neg[i]) if req["item_id"][0] == "n" else bool(i % 4)

        async def get_doc():
            status, body = await run.get("/v1/classifiers/rare")
            assert status == 200, body
            return orjson.loads(body)

        async with Reviewer(run, unique_name("rev"), answer) as reviewer:
            async def some_negatives_labelled():
                return (await get_doc())["labels"] >= 10

            await wait_for(some_negatives_labelled, 60, "labels on the negatives while the positives are provisional")
            doc = await get_doc()
            assert await positives_provisional()
            assert reviewer.requests and not any(r["predicted_positive"] for r in reviewer.requests)
            assert doc["status"] != "converged"
            for m in ("precision", "recall"):  # the held positives have no label: no interval yet
                assert doc["metrics"][m]["ci_lower"] is None, doc["metrics"]
            await send_positives(first_positives, 150)  # past the 25 x K items that stratify them

            async def both_intervals():
                d = await get_doc()
                return d if all(d["metrics"][m]["ci_lower"] is not None for m in ("precision", "recall")) else None

            doc = await wait_for(both_intervals, 60, "precision and recall intervals once the positives have strata")
            assert not await positives_provisional()
            assert any(r["predicted_positive"] for r in reviewer.requests)
        status, body = await run.get("/metrics")
        failures = [line for line in body.decode().splitlines()
                    if line.startswith("stratameter_classifier_failures_total{")]
        assert failures and all(line.endswith(" 0.0") for line in failures), failures


async def test_a_chunk_whose_reservoirs_run_out_ends_exhausted(kafka_bootstrap, redis_url, unique_name):
    """RESERVOIR_SIZE bounds the labels of a stratum in a chunk.  Rare positives (1 %) and a delta
    the chunk cannot reach with 64 items a stratum: the negative strata next to the threshold fill
    their reservoirs first; a round's labels that a full reservoir cannot give go to the strata that
    can, until every reservoir is used, and once the chunk has closed its status is `exhausted`.
    Before, the rounds kept asking the full reservoirs, nothing was issued, and the chunk stayed
    `open` for good."""
    pop = whole_builtin("fraud-rare", size=20_000)
    reservoir, chunk_seconds = 64, 20
    settings = {"DELTA": "0.1", "CONFIDENCE": "0.95", "MAX_LABELS_PER_HOUR": "20000", "METRICS": "precision,recall",
                "RESERVOIR_SIZE": str(reservoir), "CHUNK_SECONDS": str(chunk_seconds), "ALLOWED_LATENESS_SECONDS": "1"}
    async with running_service(kafka_bootstrap, redis_url, unique_name, **settings) as run:
        while time.time() % chunk_seconds > chunk_seconds - 12:  # the items land in one chunk
            await asyncio.sleep(0.5)
        now_ms = int(time.time() * 1000)
        for i, s in enumerate(pop.scores):
            await run.send_score(classifier_id="rare", item_id=f"i{i}", score=float(s), event_time=now_ms)

        async def exhausted():
            status, body = await run.get("/v1/classifiers/rare")
            doc = orjson.loads(body) if status == 200 else None
            return doc if doc and doc["status"] == "exhausted" else None

        async with Reviewer(run, unique_name("rev"), lambda req: bool(pop.labels[int(req["item_id"][1:])])):
            doc = await wait_for(exhausted, 120, "the chunk to close exhausted")
    assert doc["closed"] and doc["pending"] == 0 and doc["scores"] == pop.size
    assert [s["labels"] for s in doc["strata"]] == [min(s["items"], reservoir) for s in doc["strata"]]
    assert doc["labels"] == sum(min(s["items"], reservoir) for s in doc["strata"])
    assert doc["metrics"]["recall"]["ci_upper"] - doc["metrics"]["recall"]["ci_lower"] > 2 * 0.1
