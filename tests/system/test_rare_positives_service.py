"""Recall on rare positives through the service (issue 51): a built-in whole-stream population at 1-2 %
prevalence sent as one burst with METRICS=precision,recall,f1,accuracy, reviewers answering from the
ground truth.  The chunk converges with every interval within delta and covering the truth, every
count exact, and recall's labels well under what simple random sampling needs for recall alone.

The CI run is small (60,000 items, delta 0.1).  The measurement of
docs/development/label-efficiency.md ("The service end to end") is the same test on the simulator's
populations, 200,000 items at delta 0.05 (RESERVOIR_SIZE raised: those strata take up to 2,000 labels):

    STRATAMETER_RARE_ITEMS=200000 STRATAMETER_RARE_DELTA=0.05 STRATAMETER_RARE_RESERVOIR=16384 \\
        .venv/bin/python -m pytest -s -p no:xdist tests/system/test_rare_positives_service.py

Each run prints one JSON line: labels per stratum, each metric's interval against its truth and the
labels random sampling needs for that half-width (`WholeStream.srs_variance`, with the finite
population correction), and the Redis memory of the classifier's keys (both sides)."""

from __future__ import annotations

import asyncio
import os
import time

import orjson
import pytest

from stratameter.bench.ingest import classifier_bytes
from stratameter.simulate.whole_populations import whole_builtin
from stratameter.state.keys import NEGATIVES_SUFFIX
from stratameter.stats.estimator import z_value
from tests.harness import Reviewer, running_service, wait_for

pytestmark = pytest.mark.system

ITEMS = int(os.environ.get("STRATAMETER_RARE_ITEMS", "60000"))
DELTA = float(os.environ.get("STRATAMETER_RARE_DELTA", "0.1"))
RESERVOIR = os.environ.get("STRATAMETER_RARE_RESERVOIR", "1024")
#: All four intervals but one must cover: all four at 0.95 failed one of five clean-clone runs (F1 by
#: 0.003), two misses in four where each covers 0.95-0.99 (`simulate --metric`) happen in about 1 % of runs
CONFIDENCE = 0.95
CHUNK_SECONDS = 3600
METRICS = ("precision", "recall", "f1", "accuracy")


def random_labels(pop, metric: str, halfwidth: float) -> float:
    """Labels simple random sampling of the chunk needs for `halfwidth` at `CONFIDENCE`, without replacement."""
    z = z_value(CONFIDENCE)
    n0 = z * z * pop.srs_variance(metric, 1) / (halfwidth * halfwidth)
    return n0 / (1.0 + (n0 - 1.0) / pop.size)


@pytest.mark.parametrize("name", ["fraud-rare", "abuse-rare-weak"])
async def test_rare_positives_converge_through_the_service(name, kafka_bootstrap, redis_url, unique_name):
    pop = whole_builtin(name, size=ITEMS)
    settings = {"DELTA": str(DELTA), "CONFIDENCE": str(CONFIDENCE), "MAX_LABELS_PER_HOUR": "1000000",
                "METRICS": ",".join(METRICS), "CHUNK_SECONDS": str(CHUNK_SECONDS), "RESERVOIR_SIZE": RESERVOIR}
    async with running_service(kafka_bootstrap, redis_url, unique_name, **settings) as run:
        while time.time() % CHUNK_SECONDS > CHUNK_SECONDS - 120:  # the burst (seconds) lands in one chunk
            await asyncio.sleep(1)
        started, now_ms = time.monotonic(), int(time.time() * 1000)
        for i, s in enumerate(pop.scores):
            await run.send_score(classifier_id="rare", item_id=f"i{i}", score=float(s), event_time=now_ms)
        asked: dict[str, int] = {}

        def answer(req):
            asked[req["request_id"]] = asked.get(req["request_id"], 0) + 1
            return bool(pop.labels[int(req["item_id"][1:])])

        async def converged():
            status, body = await run.get("/v1/classifiers/rare")
            doc = orjson.loads(body) if status == 200 else None
            return doc if doc and doc["status"] == "converged" else None

        async with Reviewer(run, unique_name("rev"), answer):
            doc = await wait_for(converged, 240, f"{name} to converge")
        seconds = time.monotonic() - started
        prefix = run.service.settings.redis_key_prefix
        memory = sum([await classifier_bytes(run.service.redis, prefix, cid) for cid in ("rare", "rare" + NEGATIVES_SUFFIX)])
    assert doc["scores"] == doc["population"] == pop.size
    assert doc["labels"] == len(asked) == sum(s["labels"] for s in doc["strata"]) and set(asked.values()) == {1}
    assert doc["labels_by_outcome"]["accepted"] == doc["labels"] and doc["pending"] == 0
    report = {"population": name, "items": pop.size, "prevalence": pop.prevalence, "delta": DELTA,
              "reservoir": int(RESERVOIR), "seconds": round(seconds, 1), "labels": doc["labels"],
              "strata": [[s["side"], s["items"], s["labels"]] for s in doc["strata"]], "redis_bytes": memory}
    misses = []
    for m in METRICS:
        iv, truth = doc["metrics"][m], pop.truth(m)
        assert iv["ci_upper"] - iv["ci_lower"] <= 2 * DELTA + 1e-9, (m, iv)
        if not iv["ci_lower"] <= truth <= iv["ci_upper"]:
            misses.append((m, truth, iv))
        report[m] = {"truth": round(truth, 4), "estimate": round(iv["estimate"], 4),
                     "halfwidth": round((iv["ci_upper"] - iv["ci_lower"]) / 2, 4),
                     "random_labels": round(random_labels(pop, m, DELTA))}
    assert len(misses) <= 1, misses
    report["labels_over_random_recall"] = round(doc["labels"] / report["recall"]["random_labels"], 3)
    assert report["labels_over_random_recall"] < 0.8  # the simulation's mean: 0.29 and 0.46 x
    print(orjson.dumps(report).decode())
