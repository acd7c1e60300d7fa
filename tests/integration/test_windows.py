"""Windows and the last closed chunk against a real Redis (`chunks.window`, `api.views`): three
one-minute chunks sampled by the request loop and answered; a window of three chunks pools them
(its labels and items the sums of its chunks', its intervals those of the chunks' cells), the last
closed chunk is the closed chunk's own view, and the gauges say what the JSON says."""

from __future__ import annotations

import time

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from stratameter.api.views import classifier_view
from stratameter.api.window_cells import CELLS
from stratameter.chunks.report import StrataColumns
from stratameter.chunks.window import WindowPart, window_report
from stratameter.config import load_settings
from stratameter.ingest.ingestor import ScoreIngestor
from stratameter.metrics.exposition import SnapshotCollector
from stratameter.requests.loop import RequestLoop
from stratameter.state.calls import LabelCall
from stratameter.state.process import ProcessState
from stratameter.state.store import Store

pytestmark = pytest.mark.integration

CHUNK_S = 60


async def _sample_three_chunks(store: Store, monkeypatch, cid: str) -> tuple[object, list[int]]:
    """Items arrive into three consecutive chunks; in each the loop steps and every request is
    answered (80 % positive) until the chunk's rounds stop; the clock ends 10 s into the third."""
    clock = [time.time()]
    monkeypatch.setattr(time, "time", lambda: clock[0])
    settings = load_settings({"STRATAMETER_REDIS_URL": "redis://unused", "STRATAMETER_CHUNK_SECONDS": str(CHUNK_S),
                              "STRATAMETER_ALLOWED_LATENESS_SECONDS": "0", "STRATAMETER_INSTANCE_ID": "me",
                              "STRATAMETER_DELTA": "0.2", "STRATAMETER_WINDOWS": "2m,3m",
                              "STRATAMETER_MAX_LABELS_PER_HOUR": "100000"})
    ingest = ScoreIngestor(store, settings, np.random.default_rng(0))
    rng, offsets = np.random.default_rng(1), iter(range(100_000))

    async def publish(records):
        pass

    loop = RequestLoop(store, ProcessState(), settings, publish)
    first = int(clock[0]) // CHUNK_S + 1
    chunks = [first, first + 1, first + 2]
    assert await store.registry.acquire_lease(cid, "me", 3_600_000)
    for t in chunks:
        clock[0] = t * CHUNK_S + 5.0
        n = 300
        offs = [next(offsets) for _ in range(n)]
        await ingest.apply(0, np.array(offs), [cid] * n, [f"i{o}" for o in offs], 0.5 + rng.random(n) / 2,
                           np.ones(n, bool), np.full(n, t * CHUNK_S * 1000 + 1000), [None] * n)
        clock[0] += 40.0  # the arrivals have stopped: rounds top the sample up
        for _ in range(12):
            if not await loop.step(cid):
                break
            for rid in [r.decode() for r in await store.redis.zrange(store.keys.pending(cid), 0, -1)]:
                label = "1" if rng.random() < 0.8 else "0"
                await store.requests.apply_labels([LabelCall(cid, 0, next(offsets), rid, label, int(clock[0] * 1000),
                                                             "rev")])
    clock[0] = chunks[-1] * CHUNK_S + 50.0
    return settings, chunks


async def test_a_window_pools_its_chunks_and_the_gauges_say_what_the_json_says(store: Store, monkeypatch):
    settings, chunks = await _sample_three_chunks(store, monkeypatch, "w")
    cfg = settings.for_classifier("w")
    doc = await classifier_view(store.chunks, ProcessState(), "w", cfg)
    by_start = {c["chunk"]["start"]: c for c in [doc, *doc["history"]]}
    assert len(by_start) == 3 and doc["estimate"] is not None
    states = await store.chunks.chunk_states("w", chunks)
    for name, k in (("2m", 2), ("3m", 3)):
        window = doc["windows"][name]
        pooled = states[-k:]
        assert window["chunks"] == k and window["complete"] and window["incomplete_chunks"] == []
        assert window["labels"] == sum(int(cs.n.sum()) for cs in pooled)
        assert window["population"] == sum(int(cs.N.sum()) for cs in pooled)
        expected = window_report([WindowPart(cs.chunk, StrataColumns(cs.N, cs.n, cs.h, np.ones(cs.strata, bool)),
                                             cs.chunk != chunks[-1]) for cs in pooled], ["precision"], cfg.confidence)
        assert window["metrics"]["precision"]["ci_lower"] == pytest.approx(float(expected.intervals["precision"].lower))
    single = doc["ci_upper"] - doc["ci_lower"]
    three = doc["windows"]["3m"]["metrics"]["precision"]
    assert three["ci_upper"] - three["ci_lower"] < single  # three chunks' labels
    last = doc["last_closed"]
    closed_view = by_start[last["chunk"]["start"]]
    assert closed_view["closed"] and last["chunk"]["start"] != doc["chunk"]["start"]
    assert {k: last[k] for k in ("status", "labels", "population", "metrics")} == \
        {k: closed_view[k] for k in ("status", "labels", "population", "metrics")}
    assert last["final"] == (last["status"] in ("converged", "exhausted", "stopped"))
    # the gauges: what the JSON says, one series per window and the last closed chunk
    gauges = await classifier_view(store.chunks, ProcessState(), "w", cfg, history=False)
    assert gauges["windows"] == doc["windows"] and gauges["last_closed"] == doc["last_closed"]
    CELLS._cells.clear()  # the closed chunks' cells computed again, not remembered: the same figures
    assert (await classifier_view(store.chunks, ProcessState(), "w", cfg, history=False))["windows"] == doc["windows"]
    registry = CollectorRegistry()
    registry.register(SnapshotCollector([gauges], {}, 0, {}, 0, {}, {}))
    samples = {(s.name, s.labels.get("window")): s.value for f in text_string_to_metric_families(
        generate_latest(registry).decode()) for s in f.samples if s.labels.get("classifier") == "w"}
    for window, metrics in [*((n, w["metrics"]) for n, w in doc["windows"].items()), ("last_closed", last["metrics"])]:
        for key, suffix in (("estimate", ""), ("ci_lower", "_ci_lower"), ("ci_upper", "_ci_upper"),
                            ("stderr", "_stderr")):
            assert samples[(f"stratameter_precision_window{suffix}_ratio", window)] == pytest.approx(
                metrics["precision"][key])
