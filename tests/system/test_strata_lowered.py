"""`STRATAMETER_STRATA` lowered while a chunk is open, with the predicted negatives sampled: the
chunk keeps the positive strata it was stratified with, and its negatives' stratum ids (label
requests, the API) start after them (`state.keys.first_negative_stratum`), so no id names a
stratum of each side.  Before, they started at the new setting and overlapped the positives'."""

from __future__ import annotations

import time

import numpy as np
import pytest
from scipy.special import expit

from stratameter.state.keys import first_negative_stratum
from tests.harness import run_until, service_env, service_topics

pytestmark = pytest.mark.integration


def test_the_negatives_ids_follow_the_larger_of_the_setting_and_the_chunks_positive_strata():
    assert first_negative_stratum(4) == 4
    assert first_negative_stratum(4, 1) == 4  # a provisional chunk's one stratum: the setting
    assert first_negative_stratum(2, 4) == 4  # lowered mid-chunk: after the chunk's four
    assert first_negative_stratum(6, 4) == 6  # raised: the setting, as for the chunk's earlier requests


async def test_strata_lowered_mid_chunk(kafka_bootstrap, redis_url, unique_name):
    topics = await service_topics(kafka_bootstrap, unique_name, 1)
    env = service_env(kafka_bootstrap, redis_url, topics, unique_name, CHUNK_SECONDS="3600", DELTA="0.1",
                      CONFIDENCE="0.999", MAX_LABELS_PER_HOUR="20000", METRICS="precision,recall,f1,accuracy",
                      NEGATIVE_STRATA="3")
    rng = np.random.default_rng(12)
    n = 3000
    y = rng.random(n) < 0.2
    score = expit(np.where(y, rng.normal(1.5, 1.3, n), rng.normal(-2.0, 1.3, n)))
    now_ms = int(time.time() * 1000)
    requests: list[dict] = []

    def answer(req):
        requests.append(req)
        return bool(y[int(req["item_id"][1:])])

    async def run(strata: int, items: range, until):
        return await run_until({**env, "STRATA": str(strata)}, kafka_bootstrap, unique_name,
                               [(f"i{i}", score[i], now_ms) for i in items], answer, until)

    def stratified(doc):
        return sum(s["side"] == "positive" for s in doc["strata"]) == 4 and doc["labels"] >= 20

    first = await run(4, range(n // 2), lambda d: d["scores"] == n // 2 and stratified(d))
    before = len(requests)
    doc = await run(2, range(n // 2, n), lambda d: d["scores"] == n and d["labels"] > first["labels"] + 20
                    and len(requests) > before)
    sides = [(s["stratum"], s["side"]) for s in doc["strata"]]
    assert sides == [(k, "positive") for k in range(4)] + [(k, "negative") for k in range(4, 7)]
    assert len(requests) > before  # requests issued after the restart with STRATA=2
    for req in requests:
        assert (req["stratum"] < 4) == req["predicted_positive"], req
        assert req["stratum"] < 7, req
