"""`stratameter bench --ingest-cpu`: the ingest's work per record, precision alone against every
metric, without Kafka and its scheduling noise.  The bench's records (`records.score_values`, twice
`--records` of them in one chunk, distinct items) are parsed (`parse_scores`) and applied
(`ScoreIngestor.prepare` then `submit`) a partition batch at a time, the partitions' batches taken
in turn as a poll brings them, into Redis; the CPU seconds of this process and of Redis (``INFO
cpu``) are taken over the first `--records` (the chunk's reservoirs filling) and over the next
`--records` (full: a candidate enters only under the largest priority kept), with the reservoir
candidates the INGEST payloads carried per record (what the predicted negatives add while the
reservoirs fill; counted after the timing).  The same records for
both ingests, each on fresh keys, in turn (every other repeat the every-metric one first), medians
of `--repeat`.  The service's consume pipeline overlaps this process's work with Redis's; here they
take turns, so wall time is not reported."""

from __future__ import annotations

import asyncio
import time
import uuid

import numpy as np

#: STRATAMETER_METRICS of the two ingests compared.
INGESTS = {"precision": "precision", "all_metrics": "precision,recall,f1,accuracy"}
#: The two halves of the stream timed apart.
HALVES = ("filling", "full")


def partition_batches(which: np.ndarray, values: list[bytes], partitions: int, batch: int
                      ) -> list[tuple[int, np.ndarray, list[bytes]]]:
    """(partition, offsets, values) of `batch` records at most, the partitions in turn: classifier
    c's records go to partition c % partitions, as the bench produces them."""
    by_partition: list[list[int]] = [[] for _ in range(partitions)]
    for i, c in enumerate(which.tolist()):
        by_partition[c % partitions].append(i)
    out, at = [], [0] * partitions
    while any(at[p] < len(by_partition[p]) for p in range(partitions)):
        for p in range(partitions):
            rows = by_partition[p][at[p]:at[p] + batch]
            if rows:
                out.append((p, np.arange(at[p], at[p] + len(rows)), [values[i] for i in rows]))
                at[p] += len(rows)
    return out


def reservoir_candidates(encoded: list) -> int:
    """The reservoir candidates (item and priority pairs, `ingest.aggregate._reservoir_candidates`)
    the INGEST payloads `encoded` (`state.scripts.EncodedIngest`) carry: the work that grows with
    the predicted negatives while a chunk's reservoirs fill."""
    from ..state.scripts import decode_ingest

    return sum(len(entry[1]) // 2 for e in encoded for c in decode_ingest(e)["chunks"] for entry in c["res"])


async def one_ingest(redis_url: str, metrics: str, halves: list[list], records: int, cids: list[str],
                     seed: int) -> dict[str, dict[str, float]]:
    """Apply each half's batches with these metrics on fresh keys: per half, CPU microseconds per
    `records` of this process (``python``) and of Redis (``redis``).  Raises unless Redis counted
    every record applied."""
    from stratameter.schemas.inbound import parse_scores

    from ..config import load_settings
    from ..ingest.ingestor import ScoreIngestor
    from ..state.store import Store
    from .ingest import counted, redis_cpu_seconds

    prefix = f"bench-cpu-{uuid.uuid4().hex[:8]}"
    settings = load_settings({"STRATAMETER_REDIS_URL": redis_url, "STRATAMETER_REDIS_KEY_PREFIX": prefix,
                              "STRATAMETER_METRICS": metrics})
    redis = settings.redis_client()
    ingestor = ScoreIngestor(Store(redis, prefix), settings, np.random.default_rng(seed))
    out = {}
    try:
        for name, batches in zip(HALVES, halves):
            payloads: list = []  # the INGEST payloads, counted after the timing (`reservoir_candidates`)
            redis0, cpu0 = await redis_cpu_seconds(redis), time.process_time()
            for partition, offsets, values in batches:
                batch, _ = parse_scores(values, [0] * len(values), settings.threshold_for)
                prepared = await ingestor.prepare(
                    partition, offsets[batch.index], batch.classifier_id, batch.item_id, batch.score,
                    batch.predicted_positive, batch.event_time_ms, batch.context)
                payloads += [call.payload for _, call in prepared.calls]
                await ingestor.submit(prepared)
            python_s, redis_s = time.process_time() - cpu0, await redis_cpu_seconds(redis) - redis0
            out[name] = {"python": round(python_s / records * 1e6, 3), "redis": round(redis_s / records * 1e6, 3),
                         "candidates": round(reservoir_candidates(payloads) / records, 4)}
        total, sent = await counted(redis, prefix, cids), sum(len(o) for batches in halves for _, o, _ in batches)
        if total != sent:
            raise RuntimeError(f"Redis counted {total} of {sent} records ({metrics})")
    finally:
        await redis.aclose()
    return out


async def ingest_cpu_bench(redis_url: str, records: int, classifiers: int, partitions: int, batch: int,
                           seed: int, repeat: int) -> dict:
    """`one_ingest` for each of `INGESTS`, in turn, `repeat` times; medians per half, and the ratios
    precision / every metric of this process's CPU per record and of both processes'."""
    from .records import classifier_ids, score_values

    which, values = score_values(2 * records, classifiers, seed=seed)
    halves = [partition_batches(which[s], values[s], partitions, batch)
              for s in (slice(0, records), slice(records, 2 * records))]
    # the second half's offsets follow the first's in every partition
    ends = {p: int(o[-1]) + 1 for p, o, _ in halves[0]}
    halves[1] = [(p, o + ends.get(p, 0), v) for p, o, v in halves[1]]
    cids = classifier_ids(classifiers)
    for metrics in INGESTS.values():  # untimed: the first ingest of a process would pay the warm-up
        await one_ingest(redis_url, metrics, [h[:2] for h in halves], records, cids, seed)
    runs = []
    for rep in range(repeat):  # the two ingests alternate which goes first
        order = list(INGESTS.items())[::-1 if rep % 2 else 1]
        runs.append({name: await one_ingest(redis_url, metrics, halves, records, cids, seed + rep)
                     for name, metrics in order})
    doc: dict = {"records": records, "classifiers": classifiers, "partitions": partitions,
                 "batch_max_records": batch, "repeat": repeat}
    for half in HALVES:
        median = {name: {proc: float(np.median([r[name][half][proc] for r in runs])) for proc in ("python", "redis")}
                  for name in INGESTS}
        p, a = median["precision"], median["all_metrics"]
        doc[half] = {"cpu_us_per_record": median,
                     "reservoir_candidates_per_record": {
                         name: float(np.median([r[name][half]["candidates"] for r in runs])) for name in INGESTS},
                     "python_ratio": round(p["python"] / a["python"], 3),
                     "both_ratio": round((p["python"] + p["redis"]) / (a["python"] + a["redis"]), 3)}
    doc["runs"] = runs
    return doc


def run(redis: str | None, records: int, classifiers: int, partitions: int, seed: int, repeat: int) -> dict:
    """`ingest_cpu_bench` against `redis`, or an embedded Redis, in batches of the service's default
    STRATAMETER_BATCH_MAX_RECORDS."""
    from contextlib import ExitStack

    from ..config import Settings
    from ..embedded import EmbeddedRedis

    batch = int(Settings.model_fields["batch_max_records"].default)
    with ExitStack() as stack:
        url = redis or stack.enter_context(EmbeddedRedis()).url
        return asyncio.run(ingest_cpu_bench(url, records, classifiers, partitions, batch, seed, repeat))
