"""The ingestion benchmark behind `stratameter bench`.

One run:

1. produce ``records`` score records once to a fresh topic with ``partitions``
   partitions (key = classifier_id, a classifier's records in one partition, as
   with Kafka's default partitioner); ``predicted_positive`` omitted (the service
   applies the 0.5 threshold), ``event_time`` in epoch ms inside the current chunk and
   not after the moment they are generated (so the service accepts every one of them:
   none in the future, none for a closed chunk), a small ``context`` object;
2. the service ingests them once, untimed (step 5 with a consumer group and keys of its own): in
   a process that has not, the bare consumers read 30-45% slower (2026-11-27: the bare decode
   297,000-366,000 records/s against 461,000-468,000 after this warm-up), and a single run compared
   them with a warmer service (its ratio read 0.81-0.93 there, 0.57-0.81 with the warm-up);
3. a bare aiokafka consumer (manually assigned, no group) reads them all without
   decoding: the raw rate;
4. the same, ``orjson.loads`` on every value: the bare decode rate, the standing bar's reference;
   and once more taking aiokafka's own record objects as the service does (`app.records`), the
   same consumer without aiokafka's `ConsumerRecord` wrapping: a reference the service's own
   read cannot beat;
5. a `stratameter.app.runner.Service` with a fresh consumer group consumes the topic
   (`consume_forever`, the ingest path; no request loop, no HTTP) until the
   classifiers' ``scores_total`` in Redis add up to ``records``.  On the way, when
   ``memory_at`` records are counted (default: a fifth and a half of them), and at the end, the Redis memory of each
   classifier's keys is measured (``MEMORY USAGE key SAMPLES 0``).

With ``repeat`` > 1, steps 3-5 (and the every-metric and cluster ingests) run that many times
in turn on the same records, and the rates and ratios reported are medians: one ingest of the
default bench lasts about two seconds, and on a small machine a neighbour's burst moves a
single reading by a tenth or more.  The every-metric ingest runs after precision's in the odd
repeats (the first, third, ...) and before it in the even ones, so that neither of the two compared
always runs second.

Every rate is ``records / (t_last - t_first)`` where ``t_first`` is when the
consumer's first non-empty ``getmany`` returned: the consumer-group join (tansu
answers a JoinGroup only after ``session_timeout_ms / 2``) and the connection set-up
are excluded the same way for all three consumers.  Each consumer fetches with
aiokafka's defaults and ``max_records`` equal to the service's
``STRATAMETER_BATCH_MAX_RECORDS``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import orjson

from stratameter.schemas.outbound import score_record_bytes
from .ingest import service_consume

CHUNK_MS = 3_600_000  # the service's default chunk (STRATAMETER_CHUNK_SECONDS=3600)


@dataclass
class BenchResult:
    records: int
    classifiers: int
    partitions: int
    batch_max_records: int
    service_records_per_s: float
    raw_consume_decode_records_per_s: float
    raw_consume_records_per_s: float
    # the bare decode consumer reading aiokafka's own record objects, as the service's consumer does
    raw_consume_decode_own_records_per_s: float
    service_seconds: float
    service_join_seconds: float
    decode_seconds: float
    raw_seconds: float
    redis_bytes_per_classifier: int
    records_counted: int
    produce_seconds: float
    memory: list[dict] = field(default_factory=list)  # [{"records", "bytes_per_classifier"}], in order
    # with `all_metrics`: the same ingest with STRATAMETER_METRICS=precision,recall,f1,accuracy (both
    # sides of the threshold kept), in the same run
    service_all_metrics_records_per_s: float | None = None
    redis_bytes_per_classifier_all_metrics: int | None = None
    # with `redis_cluster`: the same ingest against a Redis Cluster (STRATAMETER_REDIS_CLUSTER=true), in the same run
    service_cluster_records_per_s: float | None = None
    redis_bytes_per_classifier_cluster: int | None = None
    # with `serve`: the whole service over the ingested classifiers (`serve.serve_bench`), per backend
    serve: dict | None = None
    # with `repeat` > 1: every timed consumer again on the same records, in the same order, that many
    # times; each rate above is then the median over the repeats and each ratio the median of the
    # per-repeat ratios.  Per repeat: {"raw", "decode", "service"[, "all_metrics"][, "cluster"]} records/s
    repeats: list[dict] = field(default_factory=list)
    # per repeat, per service ingest ("service"[, "all_metrics"][, "cluster"]): its CPU seconds
    # (`ingest.service_consume`: {"python", "redis"}), the work behind each rate above
    cpu: list[dict] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        return self._median_ratio("service", "decode", self.service_records_per_s / self.raw_consume_decode_records_per_s)

    def _median_ratio(self, num: str, den: str, single: float) -> float:
        """The median over the repeats of rate `num` / rate `den` (`single` without repeats): a
        ratio of two rates of the same repeat, so a slow moment of the machine hits both."""
        if len(self.repeats) < 2:
            return single
        return float(np.median([r[num] / r[den] for r in self.repeats]))

    def as_json(self) -> dict:
        return {
            "records": self.records,
            "service_records_per_s": round(self.service_records_per_s),
            "raw_consume_decode_records_per_s": round(self.raw_consume_decode_records_per_s),
            "ratio": round(self.ratio, 3),
            "redis_bytes_per_classifier": self.redis_bytes_per_classifier,
            "raw_consume_records_per_s": round(self.raw_consume_records_per_s),
            "raw_consume_decode_own_records_per_s": round(self.raw_consume_decode_own_records_per_s),
            "ratio_vs_own_records_decode": round(self._median_ratio(
                "service", "decode_own", self.service_records_per_s / self.raw_consume_decode_own_records_per_s), 3),
            "records_counted": self.records_counted,
            "classifiers": self.classifiers,
            "partitions": self.partitions,
            "batch_max_records": self.batch_max_records,
            "service_seconds": round(self.service_seconds, 3),
            "decode_seconds": round(self.decode_seconds, 3),
            "raw_seconds": round(self.raw_seconds, 3),
            "service_join_seconds": round(self.service_join_seconds, 3),
            "produce_seconds": round(self.produce_seconds, 3),
            "redis_bytes_per_classifier_at": self.memory,
            **({} if self.service_all_metrics_records_per_s is None else {
                "service_all_metrics_records_per_s": round(self.service_all_metrics_records_per_s),
                "all_metrics_vs_precision": round(self._median_ratio(
                    "all_metrics", "service", self.service_all_metrics_records_per_s / self.service_records_per_s), 3),
                "redis_bytes_per_classifier_all_metrics": self.redis_bytes_per_classifier_all_metrics}),
            **({} if self.service_cluster_records_per_s is None else {
                "service_cluster_records_per_s": round(self.service_cluster_records_per_s),
                "cluster_vs_single": round(self._median_ratio(
                    "cluster", "service", self.service_cluster_records_per_s / self.service_records_per_s), 3),
                "redis_bytes_per_classifier_cluster": self.redis_bytes_per_classifier_cluster}),
            **({} if self.serve is None else {"serve": self.serve}),
            **({"repeats": [{k: round(v) for k, v in r.items()} for r in self.repeats]} if len(self.repeats) > 1 else {}),
            **self._cpu_json(),
        }

    def _cpu_json(self) -> dict:
        """``cpu_us_per_record``: per ingest, the median over the repeats of this process's and
        Redis's CPU microseconds per record; ``all_metrics_vs_precision_cpu``: the median of the
        per-repeat ratios of precision's CPU (both processes) per record to every metric's, the
        cost ratio behind ``all_metrics_vs_precision`` without the machine's scheduling noise."""
        if not self.cpu:
            return {}
        per_record = {
            ingest: {side: (None if any(c[ingest][side] is None for c in self.cpu) else
                            round(float(np.median([c[ingest][side] for c in self.cpu])) * 1e6 / self.records, 3))
                     for side in ("python", "redis")}
            for ingest in self.cpu[0]}
        out: dict = {"cpu_us_per_record": per_record}
        if "all_metrics" in self.cpu[0] and per_record["service"]["redis"] is not None:
            def total(c: dict) -> float:
                return c["python"] + c["redis"]
            out["all_metrics_vs_precision_cpu"] = round(float(np.median(
                [total(c["service"]) / total(c["all_metrics"]) for c in self.cpu])), 3)
        return out


# --------------------------------------------------------------------------- records


def classifier_ids(n: int) -> list[str]:
    return [f"bench-clf-{i:02d}" for i in range(n)]


def score_values(records: int, classifiers: int, seed: int = 0, now_ms: int | None = None
                 ) -> tuple[np.ndarray, list[bytes]]:
    """(classifier index per record, JSON values): realistic score records.

    Scores: a mixture of a mass near 0 and a mass near 1 (about 40% predicted
    positive at the 0.5 threshold); event times increasing from the start of the current
    hour to `now_ms`, so the whole stream falls in one chunk and no event time is in the
    future (the service dead-letters one more than STRATAMETER_MAX_EVENT_TIME_SKEW_SECONDS
    ahead of its clock); fixed-width ids and context, so a reservoir member's size does not
    depend on how far into the stream it was produced.
    """
    rng = np.random.default_rng(seed)
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    chunk_start = now_ms // CHUNK_MS * CHUNK_MS
    which = rng.integers(0, classifiers, records)
    pos = rng.random(records) < 0.4
    scores = np.where(pos, rng.beta(8, 2, records) * 0.5 + 0.5, rng.beta(2, 8, records) * 0.5)
    event = chunk_start + (np.arange(records, dtype=np.int64) * (now_ms - chunk_start)) // max(records, 1)
    sources = ("web", "mobile", "api")
    cids = classifier_ids(classifiers)
    values = [
        score_record_bytes(cids[c], f"item-{i:09d}", round(s, 6), event_time=e,
                           context={"source": sources[i % 3], "locale": "en-US", "session": f"s{i % 9973:05d}"})
        for i, (c, s, e) in enumerate(zip(which.tolist(), scores.tolist(), event.tolist()))
    ]
    return which, values


async def produce(bootstrap: str, topic: str, partitions: int, which: np.ndarray, values: list[bytes],
                  classifiers: int) -> None:
    """Produce with explicit batches: classifier c's records go to partition c % partitions."""
    from aiokafka import AIOKafkaProducer

    keys = [c.encode() for c in classifier_ids(classifiers)]
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False, acks=1,
                                max_batch_size=1 << 20, max_request_size=1 << 21)
    await producer.start()
    try:
        ts = int(time.time() * 1000)
        pending = []
        batches = [producer.create_batch() for _ in range(partitions)]
        for c, v in zip(which.tolist(), values):
            p = c % partitions
            if batches[p].append(key=keys[c], value=v, timestamp=ts) is None:
                batches[p].close()
                pending.append(await producer.send_batch(batches[p], topic, partition=p))
                batches[p] = producer.create_batch()
                batches[p].append(key=keys[c], value=v, timestamp=ts)
                if len(pending) >= 32:
                    await asyncio.gather(*pending)
                    pending.clear()
        for p, b in enumerate(batches):
            if b.record_count():
                b.close()
                pending.append(await producer.send_batch(b, topic, partition=p))
        await asyncio.gather(*pending)
    finally:
        await producer.stop()


# --------------------------------------------------------------------------- bare consumer


async def bare_consume(bootstrap: str, topic: str, partitions: int, records: int, decode: bool,
                       max_records: int, timeout_s: float, own: bool = False) -> float:
    """Seconds from the first non-empty fetch to the last record read (and decoded); `own`:
    taking aiokafka's own record objects (`app.records`), as the service's consumer does."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from ..app import records as own_records

    own_records.install()  # for every bare consumer, so each repeat's references read through the same class
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                                auto_offset_reset="earliest",
                                **({"value_deserializer": own_records.own_records} if own else {}))
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        await consumer.seek_to_beginning()
        loads = orjson.loads
        count = 0
        t0 = None
        deadline = time.monotonic() + timeout_s
        while count < records:
            if time.monotonic() > deadline:
                raise TimeoutError(f"bare consumer read {count} of {records} records in {timeout_s:.0f}s")
            batches = await consumer.getmany(timeout_ms=500, max_records=max_records)
            if t0 is None and batches:
                t0 = time.perf_counter()
            for recs in batches.values():
                if decode:
                    for r in recs:
                        loads(r.value)
                count += len(recs)
        return time.perf_counter() - t0
    finally:
        await consumer.stop()


# --------------------------------------------------------------------------- the run


async def run_bench(kafka: str, redis_url: str, records: int = 500_000, classifiers: int = 10,
                    partitions: int = 3, memory_at: list[int] | None = None, seed: int = 0,
                    log: Callable[[str], None] = lambda msg: None, timeout_s: float | None = None,
                    all_metrics: bool = False, redis_cluster: str | None = None, serve: int = 0,
                    serve_load: float = 0.5, repeat: int = 1) -> BenchResult:
    """One benchmark run against the given Kafka bootstrap servers and Redis URL (with
    `all_metrics`, the service's ingest a second time with every metric enabled; with
    `redis_cluster`, the URL of a Redis Cluster node, once more against that cluster; with `serve`
    answers, the whole service over the ingested state on each backend, `serve.serve_bench`, with
    scores streaming at `serve_load` times the measured ingest rate meanwhile).

    Uses fresh topic, consumer group and Redis key prefix names, so it can run
    against shared backends; it does not delete them afterwards.  Over 60 lines on purpose: the
    measurements in the order they run, one call each, with the settings they share.
    """
    from ..config import load_settings
    from ..embedded import create_topics

    if records < 1 or classifiers < 1 or partitions < 1 or repeat < 1:
        raise ValueError("records, classifiers, partitions and repeat must be >= 1")
    memory_at = [records // 5, records // 2] if memory_at is None else memory_at
    timeout_s = timeout_s if timeout_s is not None else 120 + records / 2000
    run_id = uuid.uuid4().hex[:10]
    names = {k: f"bench-{k}-{run_id}" for k in ("scores", "requests", "labels", "dlq")}
    await create_topics(kafka, [names["scores"]], partitions=partitions)
    await create_topics(kafka, [names["requests"], names["labels"], names["dlq"]], partitions=1)
    env = {
        "STRATAMETER_KAFKA_BOOTSTRAP_SERVERS": kafka,
        "STRATAMETER_KAFKA_CONSUMER_GROUP": f"bench-{run_id}",
        "STRATAMETER_KAFKA_SESSION_TIMEOUT_MS": "6000",
        "STRATAMETER_REDIS_URL": redis_url,
        "STRATAMETER_REDIS_KEY_PREFIX": f"bench-{run_id}",
        "STRATAMETER_TOPIC_SCORES": names["scores"],
        "STRATAMETER_TOPIC_LABEL_REQUESTS": names["requests"],
        "STRATAMETER_TOPIC_LABELS": names["labels"],
        "STRATAMETER_TOPIC_DEAD_LETTER": names["dlq"],
    }
    settings = load_settings(env)
    max_records = settings.batch_max_records

    log(f"generating {records:,} score records for {classifiers} classifiers")
    cids_b = [c.encode() for c in classifier_ids(classifiers)]
    which, values = score_values(records, classifiers, seed)
    log(f"producing to {names['scores']} ({partitions} partitions)")
    t0 = time.perf_counter()
    await produce(kafka, names["scores"], partitions, which, values, classifiers)
    produce_s = time.perf_counter() - t0
    stream = [(cids_b[c], v) for c, v in zip(which.tolist(), values)] if serve else []
    del values

    cids = classifier_ids(classifiers)
    cluster_env = {**_renamed(env, "-cluster"), "STRATAMETER_REDIS_URL": redis_cluster or "",
                   "STRATAMETER_REDIS_CLUSTER": "true"}
    log("warm-up: the service ingests the topic once, untimed (fresh group and keys)")
    await service_consume(load_settings(_renamed(env, "-warm")), cids, records, [], timeout_s)
    runs, cpus = [], []
    for rep in range(repeat):
        tag = f" (repeat {rep + 1} of {repeat})" if repeat > 1 else ""
        log("bare consumer, raw (no decoding)" + tag)
        raw_s = await bare_consume(kafka, names["scores"], partitions, records, False, max_records, timeout_s)
        log("bare consumer, orjson.loads per record" + tag)
        decode_s = await bare_consume(kafka, names["scores"], partitions, records, True, max_records, timeout_s)
        log("bare consumer, orjson.loads per record, aiokafka's own record objects" + tag)
        own_s = await bare_consume(kafka, names["scores"], partitions, records, True, max_records, timeout_s, own=True)
        fresh = _fresh(env, rep)
        every_first = all_metrics and rep % 2 == 1  # alternate: neither of the two compared always runs second
        every = await _every_metric(fresh, cids, records, timeout_s, log) if every_first else None
        log("service ingest path (fresh consumer group)" + tag)
        service_s, join_s, snaps, cpu = await service_consume(load_settings(fresh), cids, records,
                                                              memory_at if rep == 0 else [], timeout_s)
        if all_metrics and not every_first:
            every = await _every_metric(fresh, cids, records, timeout_s, log)
        cluster = await _ingest(_fresh(cluster_env, rep), cids, records, timeout_s, log,
                                "on the Redis Cluster") if redis_cluster else None
        runs.append((raw_s, decode_s, service_s, join_s, snaps, every, cluster, own_s))
        cpus.append({"service": cpu, **({"all_metrics": every[2]} if every else {}),
                     **({"cluster": cluster[2]} if cluster else {})})
    rates = [{"raw": records / r[0], "decode": records / r[1], "decode_own": records / r[7],
              "service": records / r[2],
              **({"all_metrics": records / r[5][0]} if all_metrics else {}),
              **({"cluster": records / r[6][0]} if redis_cluster else {})} for r in runs]
    median = {k: float(np.median([r[k] for r in rates])) for k in rates[0]}
    raw_s, decode_s, service_s, join_s, snaps, every, cluster, _ = runs[0]
    counted_records = min(r[4][-1]["records"] for r in runs)
    backends = {"redis": env, **({"cluster": cluster_env} if redis_cluster else {})}
    served = await _serve(backends, kafka, names, cids, stream, median["service"] * serve_load, serve, timeout_s,
                          log) if serve else {}
    return BenchResult(
        records=records, classifiers=classifiers, partitions=partitions, batch_max_records=max_records,
        service_records_per_s=median["service"], raw_consume_decode_records_per_s=median["decode"],
        raw_consume_records_per_s=median["raw"], raw_consume_decode_own_records_per_s=median["decode_own"],
        service_seconds=records / median["service"],
        service_join_seconds=join_s, decode_seconds=records / median["decode"], raw_seconds=records / median["raw"],
        redis_bytes_per_classifier=snaps[-1]["bytes_per_classifier"],
        records_counted=counted_records, produce_seconds=produce_s, memory=snaps,
        service_all_metrics_records_per_s=median["all_metrics"] if all_metrics else None,
        redis_bytes_per_classifier_all_metrics=every[1] if every else None,
        service_cluster_records_per_s=median["cluster"] if redis_cluster else None,
        redis_bytes_per_classifier_cluster=cluster[1] if cluster else None,
        serve=served or None, repeats=rates, cpu=cpus,
    )


def _fresh(env: dict, rep: int) -> dict:
    """`env` with the consumer group and key prefix of repeat `rep` (the first keeps its names)."""
    return env if rep == 0 else _renamed(env, f"-r{rep}")


def _renamed(env: dict, suffix: str) -> dict:
    """`env` with `suffix` appended to its consumer group and key prefix: an ingest of its own, which
    reads the topic from the start into keys no other ingest of the run touches."""
    return {**env, "STRATAMETER_KAFKA_CONSUMER_GROUP": env["STRATAMETER_KAFKA_CONSUMER_GROUP"] + suffix,
            "STRATAMETER_REDIS_KEY_PREFIX": env["STRATAMETER_REDIS_KEY_PREFIX"] + suffix}


async def _every_metric(env: dict, cids: list[str], records: int, timeout_s: float, log) -> tuple[float, int, dict]:
    """`_ingest` with every metric enabled (both sides of the threshold kept), on a fresh consumer
    group and key prefix (those of `env` with ``-all``)."""
    every = {**_renamed(env, "-all"), "STRATAMETER_METRICS": "precision,recall,f1,accuracy"}
    return await _ingest(every, cids, records, timeout_s, log, "every metric (both sides of the threshold)")


async def _ingest(env: dict, cids: list[str], records: int, timeout_s: float, log, what: str
                  ) -> tuple[float, int, dict]:
    """One more timed ingest of the service with the settings `env` (a fresh consumer group and key
    prefix), logged as `what`: (seconds, Redis bytes per classifier at the end, CPU seconds as
    `service_consume` gives them)."""
    from ..config import load_settings

    log(f"service ingest path, {what} (fresh group and keys)")
    seconds, _, snaps, cpu = await service_consume(load_settings(env), cids, records, [], timeout_s)
    return seconds, snaps[-1]["bytes_per_classifier"], cpu


async def _serve(backends: dict[str, dict], kafka: str, names: dict[str, str], cids: list[str], stream: list,
                 rate: float, answers: int, timeout_s: float, log) -> dict[str, dict]:
    """`serve.serve_bench` on each backend's state (its settings in `backends`), one after the other."""
    from .serve import serve_bench

    out = {}
    for name, backend_env in backends.items():
        log(f"the whole service on {name}")
        out[name] = await serve_bench(backend_env, kafka, names, cids, stream, rate, answers, timeout_s, log)
    return out


def bench(records: int = 500_000, classifiers: int = 10, partitions: int = 3, kafka: str | None = None,
          redis: str | None = None, memory_at: list[int] | None = None, seed: int = 0,
          log: Callable[[str], None] = lambda msg: None, all_metrics: bool = False,
          redis_cluster: bool | str = False, serve: int = 0, serve_load: float = 0.5, repeat: int = 1) -> BenchResult:
    """`run_bench` with embedded tansu / Redis for the backends not given (`redis_cluster`: a
    cluster node's URL, or True for a local three-master cluster)."""
    from contextlib import ExitStack

    from ..embedded import EmbeddedKafka, EmbeddedRedis, EmbeddedRedisCluster

    with ExitStack() as stack:
        if kafka is None:
            log("starting embedded Kafka (tansu)")
            kafka = stack.enter_context(EmbeddedKafka()).bootstrap
        if redis is None:
            log("starting embedded Redis")
            redis = stack.enter_context(EmbeddedRedis()).url
        if redis_cluster is True:
            log("starting a local Redis Cluster (three masters)")
            redis_cluster = stack.enter_context(EmbeddedRedisCluster()).url
        return asyncio.run(run_bench(kafka, redis, records, classifiers, partitions, memory_at, seed, log,
                                     all_metrics=all_metrics, redis_cluster=redis_cluster or None,
                                     serve=serve, serve_load=serve_load, repeat=repeat))
