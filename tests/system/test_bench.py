"""`stratameter bench` on a small stream (a correctness check, not a timing assertion),
and the ingest's reservoir cutoff (the optimisation the benchmark led to) keeping the
exact same bottom-k sample."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from redis.asyncio import Redis

from stratameter.bench.command import main as bench_main
from stratameter.bench.core import run_bench
from stratameter.bench.records import score_values
from stratameter.config import load_settings
from stratameter.ingest.ingestor import ScoreIngestor
from stratameter.state.store import Store

pytestmark = pytest.mark.integration

KEYS = {"records", "service_records_per_s", "raw_consume_decode_records_per_s", "ratio", "redis_bytes_per_classifier"}


async def test_bench_counts_every_record_and_reports_the_json_shape(kafka_bootstrap, redis_url):
    result = await run_bench(kafka_bootstrap, redis_url, records=5000, classifiers=3, partitions=2,
                             memory_at=[1000])
    doc = result.as_json()
    assert KEYS <= set(doc)
    json.dumps(doc)  # plain JSON types only
    assert doc["records"] == 5000
    assert doc["records_counted"] == 5000  # Redis state counts exactly what was produced
    for key in ("service_records_per_s", "raw_consume_decode_records_per_s", "raw_consume_records_per_s",
                "raw_consume_decode_own_records_per_s"):
        assert doc[key] > 0
    # the ratio is rounded to 3 decimals: within that, whatever its size (a loaded machine can
    # make a 5000-record run's ratio smaller than 0.05, where 1% is finer than the rounding)
    assert doc["ratio"] == pytest.approx(doc["service_records_per_s"] / doc["raw_consume_decode_records_per_s"],
                                         rel=1e-2, abs=5e-4)
    # a snapshot when >= 1000 were counted (absent if one poll already saw all 5000), and at the end
    snaps = doc["redis_bytes_per_classifier_at"]
    assert 1 <= len(snaps) <= 2 and snaps[-1]["records"] == 5000
    assert all(1000 <= s["records"] for s in snaps) and all(s["bytes_per_classifier"] > 0 for s in snaps)
    assert doc["redis_bytes_per_classifier"] == snaps[-1]["bytes_per_classifier"]


async def test_bench_with_every_metric_counts_every_record_once(kafka_bootstrap, redis_url):
    """`--all-metrics --repeat 3`: each ingest with every metric keeps both sides of the threshold
    and still counts each record once (fresh groups and keys each repeat); each rate is the median
    of the repeats and each ratio the median of the per-repeat ratios; the every-metric ingest runs
    second in the first and third repeats and first in the second, all after an untimed warm-up."""
    logged: list[str] = []
    result = await run_bench(kafka_bootstrap, redis_url, records=3000, classifiers=2, partitions=2, memory_at=[],
                             all_metrics=True, repeat=3, log=logged.append)
    doc = result.as_json()
    ingests = ["every" if "every metric" in m else "precision" for m in logged if m.startswith("service ingest path")]
    assert ingests == ["precision", "every", "every", "precision", "precision", "every"]
    # the untimed warm-up ingest comes before every timed consumer
    assert logged.index(next(m for m in logged if m.startswith("warm-up"))) < logged.index(
        next(m for m in logged if m.startswith("bare consumer")))
    assert doc["records_counted"] == 3000 and doc["service_all_metrics_records_per_s"] > 0
    reps = doc["repeats"]
    assert len(reps) == 3 and all(set(r) == {"raw", "decode", "decode_own", "service", "all_metrics"} for r in reps)
    assert doc["service_records_per_s"] == pytest.approx(np.median([r["service"] for r in reps]), abs=1)
    assert doc["all_metrics_vs_precision"] == pytest.approx(
        np.median([r["all_metrics"] / r["service"] for r in reps]), rel=1e-2, abs=5e-4)
    assert doc["ratio"] == pytest.approx(np.median([r["service"] / r["decode"] for r in reps]), rel=1e-2, abs=5e-4)
    assert doc["ratio_vs_own_records_decode"] == pytest.approx(
        np.median([r["service"] / r["decode_own"] for r in reps]), rel=1e-2, abs=5e-4)
    # the negatives' strata and reservoirs live under the classifier's keys: more bytes
    assert doc["redis_bytes_per_classifier_all_metrics"] > doc["redis_bytes_per_classifier"]
    # the work behind the rates: CPU per record of this process and of Redis, per ingest and repeat
    assert len(result.cpu) == 3 and all(set(c) == {"service", "all_metrics"} for c in result.cpu)
    cpu = doc["cpu_us_per_record"]
    assert cpu["service"]["python"] > 0 and cpu["service"]["redis"] > 0
    assert cpu["all_metrics"]["redis"] > cpu["service"]["redis"]  # twice the reservoirs and histograms
    assert cpu["service"]["python"] == pytest.approx(
        np.median([c["service"]["python"] for c in result.cpu]) * 1e6 / 3000, abs=1e-3)
    assert doc["all_metrics_vs_precision_cpu"] == pytest.approx(np.median(
        [sum(c["service"].values()) / sum(c["all_metrics"].values()) for c in result.cpu]), abs=1e-3)


def test_bench_rejects_a_bad_record_count(capsys):
    with pytest.raises(SystemExit):
        from stratameter.cli import main

        main(["bench", "--records", "0"])
    assert "positive integer" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--loop-pass", "--all-metrics", "--repeat", "3"], "--all-metrics, --repeat: not with --loop-pass"),
    (["--loop-pass", "--kafka", "localhost:9092"], "--kafka: not with --loop-pass"),
    (["--older-chunks", "4"], "--older-chunks goes with --loop-pass"),
    (["--ingest-cpu", "--kafka", "localhost:9092", "--serve"], "--kafka, --serve: not with --ingest-cpu"),
    (["--ingest-cpu", "--loop-pass"], "--loop-pass, --ingest-cpu: one at a time"),
    (["--ingest-cpu", "--older-chunks", "2"], "--older-chunks goes with --loop-pass"),
    (["--scrape-chunks", "24", "--serve", "--records", "10"], "--records, --serve: not with --scrape-chunks"),
    (["--scrape-chunks", "24", "--loop-pass"], "--loop-pass, --scrape-chunks: one at a time"),
    (["--scrape-chunks", "24", "--older-chunks", "2"], "--older-chunks goes with --loop-pass"),
])
def test_bench_refuses_options_that_do_not_go_together(argv, message, capsys):
    from stratameter.cli import main

    assert main(["bench", *argv]) == 2
    assert message in capsys.readouterr().err


def test_score_values_are_valid_score_records():
    from stratameter.schemas.inbound import parse_scores

    which, values = score_values(2000, 4, seed=1)
    batch, rejects = parse_scores(values, [0] * len(values), 0.5)
    assert not rejects and len(batch) == 2000
    # every event time is one the service accepts (none in the future, none for a closed chunk),
    # also a second into an hour, when the bench starts right after a chunk boundary
    for now in (int(time.time() * 1000), 1_800_000_000_000 - 1_800_000_000_000 % 3_600_000 + 1_000):
        window = load_settings({}).event_time_window(now)
        _, values = score_values(2000, 4, seed=1, now_ms=now)
        batch, rejects = parse_scores(values, [now] * len(values), 0.5, window=window)
        assert not rejects and len(batch) == 2000 and batch.event_time_ms.max() <= now
    assert set(batch.classifier_id) == {f"bench-clf-{i:02d}" for i in range(4)}
    assert all(b"predicted_positive" not in v for v in values)
    assert 0.3 < batch.predicted_positive.mean() < 0.5
    assert np.unique(batch.event_time_ms // 3_600_000).size == 1  # one chunk
    assert which.shape == (2000,)


async def _reservoirs(redis_url: str, prefix: str, use_cutoffs: bool) -> dict:
    settings = load_settings({"STRATAMETER_REDIS_URL": redis_url, "STRATAMETER_RESERVOIR_SIZE": "16"})
    redis = Redis.from_url(redis_url)
    store = Store(redis, prefix)
    ingest = ScoreIngestor(store, settings, np.random.default_rng(3))
    rng = np.random.default_rng(5)
    n, t0 = 6000, 1_800_000_000_000
    scores = rng.uniform(0.5, 1.0, n)
    items = [f"i{i}" for i in range(n)]
    known = 0
    for start in range(0, n, 250):  # many small batches: the reservoirs fill, then cutoffs apply
        sl = slice(start, start + 250)
        size = len(items[sl])
        await ingest.apply(0, np.arange(start, start + size), ["clf"] * size, items[sl], scores[sl],
                           np.ones(size, bool), np.full(size, t0), [None] * size)
        known += sum(int(np.isfinite(c).sum()) for c in ingest._cutoffs.values())  # strata with a cutoff
        if not use_cutoffs:
            ingest._cutoffs.clear()
    t = (await store.chunks.chunk_ids("clf"))[0]
    out = {k: await redis.zrange(f"{store.keys.chunk('clf', t)}:res:{k}", 0, -1, withscores=True) for k in range(4)}
    await redis.aclose()
    return out, known


async def test_reservoir_cutoff_keeps_the_same_bottom_k(redis_url, unique_name):
    with_cut, used = await _reservoirs(redis_url, unique_name("cut"), True)
    without, _ = await _reservoirs(redis_url, unique_name("nocut"), False)
    assert used > 0  # the cutoffs were known and applied
    assert with_cut == without
    assert all(len(v) == 16 for v in with_cut.values())


def test_bench_command_json_line(kafka_bootstrap, redis_url, capsys):
    import argparse

    args = argparse.Namespace(records=600, classifiers=2, partitions=1, kafka=kafka_bootstrap, redis=redis_url,
                              seed=0, json=True, all_metrics=False, redis_cluster=False, serve=0, serve_load=0.5,
                              repeat=1, loop_pass=False, ingest_cpu=False, older_chunks=None,
                              scrape_chunks=None)
    assert bench_main(args) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1
    doc = json.loads(out[0])
    assert KEYS <= set(doc) and doc["records_counted"] == 600


def test_bench_loop_pass_reads_no_quiet_older_chunk(capsys):
    """`--loop-pass` through the real command line: every classifier's older chunks ask for a round
    and then wait for answers; the timed passes do not read them again (Redis commands per
    classifier about those of the newest two chunks alone).  On the bench's own Redis: the commands
    are counted server-wide, and a shared Redis may still serve an earlier test's service."""
    from stratameter.cli import main

    assert main(["bench", "--loop-pass", "--classifiers", "3", "--older-chunks", "2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    slow, floor = doc["with_older_chunks"], doc["newest_two_only"]
    assert doc["classifiers"] == 3 and slow["older_chunks"] == 2 and floor["older_chunks"] == 0
    assert slow["requests_pending_per_classifier"] > floor["requests_pending_per_classifier"] > 0
    assert 0 < slow["redis_commands_per_classifier"] <= floor["redis_commands_per_classifier"] + 2
    assert slow["ms_per_classifier"] > 0 and doc["vs_newest_two_only"] > 0


async def test_bench_scrape_chunks_pools_every_chunk_of_the_window(kafka_bootstrap, redis_url):
    """`--scrape-chunks`: every chunk of every classifier gets its labels in every stratum, the
    window pools every chunk with a finite estimate (the untimed start checks it, or the run
    fails), and each round starts the service with the windows off, then on (one round here)."""
    from stratameter.bench.scrape import LABELS_PER_STRATUM, scrape_bench

    logged: list[str] = []
    doc = await scrape_bench(kafka_bootstrap, redis_url, classifiers=2, chunks=3, log=logged.append, rounds=1)
    assert doc["window_chunks"] == 3 and 0 <= doc["window_estimate"] <= 1
    assert doc["labels_accepted"] == doc["window_labels"] * 2 == 2 * 3 * 4 * LABELS_PER_STRATUM  # 4 strata
    assert doc["status_changes"] >= 2 * 2  # every closed chunk judged once before the timed starts
    assert [m for m in logged if m.startswith("round")] == ["round 1 of 1: windows off", "round 1 of 1: windows on"]
    (only,) = doc["rounds"]
    assert all(only[k]["scrape_seconds_median"] > 0 and only[k]["scrape_series"] > 0 for k in ("off", "on"))
    assert only["on"]["scrape_series"] > only["off"]["scrape_series"]  # the window's series
    assert doc["on_vs_off"] == doc["ratios"][0] == pytest.approx(
        only["on"]["scrape_seconds_median"] / only["off"]["scrape_seconds_median"], abs=1e-3)


def test_partition_batches_take_the_partitions_in_turn():
    from stratameter.bench.ingest_cpu import partition_batches

    which = np.array([0, 1, 0, 2, 0, 1, 0])  # classifier of each record; 2 partitions: 0, 1, 0, 0, 0, 1, 0
    values = [f"v{i}".encode() for i in range(7)]
    out = partition_batches(which, values, 2, 2)
    assert [(p, o.tolist(), v) for p, o, v in out] == [
        (0, [0, 1], [b"v0", b"v2"]), (1, [0, 1], [b"v1", b"v5"]), (0, [2, 3], [b"v3", b"v4"]), (0, [4], [b"v6"])]


def test_bench_ingest_cpu_counts_every_record_of_both_ingests(redis_url, capsys):
    """`--ingest-cpu` through the real command line: both ingests apply both halves (it fails unless
    Redis counted every record) and report the CPU per record of each half; the second repeat runs
    the every-metric ingest first."""
    from stratameter.cli import main

    assert main(["bench", "--ingest-cpu", "--records", "3000", "--classifiers", "4", "--partitions", "2",
                 "--redis", redis_url, "--repeat", "2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert doc["records"] == 3000 and len(doc["runs"]) == doc["repeat"] == 2
    assert [list(r) for r in doc["runs"]] == [["precision", "all_metrics"], ["all_metrics", "precision"]]
    for half in ("filling", "full"):
        cpu = doc[half]["cpu_us_per_record"]
        assert set(cpu) == {"precision", "all_metrics"}
        assert all(cpu[name]["python"] > 0 and cpu[name]["redis"] >= 0 for name in cpu)
        assert doc[half]["python_ratio"] > 0 and doc[half]["both_ratio"] > 0
        # every metric adds the predicted negatives' candidates; while the reservoirs fill (750
        # records a stratum and classifier here, under RESERVOIR_SIZE) every record is one
        candidates = doc[half]["reservoir_candidates_per_record"]
        assert 0 < candidates["precision"] < candidates["all_metrics"] <= 1
    assert doc["filling"]["reservoir_candidates_per_record"]["all_metrics"] == 1


def test_bench_on_a_cluster_and_serving(kafka_bootstrap, redis_url, redis_cluster_url, capsys):
    """`--redis-cluster URL --serve N` through the real command line: the cluster ingest counts every
    record, and on each backend `stratameter run` owns both classifiers, is scraped and folds N answers."""
    from stratameter.cli import main

    argv = ["bench", "--records", "800", "--classifiers", "2", "--partitions", "1", "--kafka", kafka_bootstrap,
            "--redis", redis_url, "--redis-cluster", redis_cluster_url, "--serve", "6", "--json"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert doc["records_counted"] == 800 and doc["service_cluster_records_per_s"] > 0
    for backend in ("redis", "cluster"):
        served = doc["serve"][backend]
        assert served["label_round_trips"] == 6 and served["label_round_trips_complete"]
        assert 0 < served["label_round_trip_ms_p50"] <= served["label_round_trip_ms_p99"]
        assert served["scrape_series"] > 0 and served["scrape_bytes"] > 0


async def test_a_refused_batch_is_redone_from_the_stored_offset_not_a_later_prediction(redis_url, unique_name):
    """The ingest yields while it aggregates (so the previous poll's Redis calls overlap it): a
    batch can then be prepared between another batch's refusal and its redo.  The redo starts
    from the offset the refusal reported, not from the cache, where the later batch has put its
    own prediction; otherwise the refused batch's records would be dropped."""
    settings = load_settings({"STRATAMETER_REDIS_URL": redis_url})
    redis = Redis.from_url(redis_url)
    store = Store(redis, unique_name("redo"))
    ingest = ScoreIngestor(store, settings, np.random.default_rng(1))
    t0, rng = 1_800_000_000_000, np.random.default_rng(2)

    def batch(first: int, n: int = 100) -> tuple:
        return (0, np.arange(first, first + n), ["clf"] * n, [f"i{first + i}" for i in range(n)],
                rng.uniform(0.5, 1.0, n), np.ones(n, bool), np.full(n, t0), [None] * n)

    assert await ingest.apply(*batch(0)) == 100
    ingest._offsets[("clf", 0)] = 50  # stale (another writer moved it): the next INGEST is refused
    b = await ingest.prepare(*batch(100))
    later: list = []
    calls = ingest._calls

    async def between_refusal_and_redo(*args, **kwargs):
        if not later:  # the batch after it is prepared meanwhile (and predicts offset 299)
            later.append(None)
            later[0] = await ingest.prepare(*batch(200))
        return await calls(*args, **kwargs)

    ingest._calls = between_refusal_and_redo
    assert await ingest.submit(b) == 100
    ingest._calls = calls
    assert ingest._offsets[("clf", 0)] >= 199
    assert await ingest.submit(later[0]) == 100
    assert int((await store.chunks.classifier_summary("clf"))["meta"]["scores_total"]) == 300
    await redis.aclose()
