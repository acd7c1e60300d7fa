"""`stratameter run` as real subprocesses killed with SIGKILL: one instance
killed and restarted mid-ingest and mid-labelling; two and three instances in
one consumer group over 6 partitions with instances killed for good, the
survivors taking over.  Afterwards: no score lost or counted twice, no label
folded twice, no item requested twice, dead letters carry original and reason,
each classifier's gauges exported by exactly one live instance."""

from __future__ import annotations

import asyncio
import base64
import time

import pytest
from aiokafka import AIOKafkaProducer

from stratameter.embedded import find_free_port
from tests.harness import (RedisBackend, ServiceProcess, converged, http_get, labels_folded, new_workload, read_topic,
                           scores_counted, wait_for)

pytestmark = pytest.mark.integration

SETTINGS = {"DELTA": "0.06", "CONFIDENCE": "0.99", "MAX_LABELS_PER_HOUR": "100000",
            "BATCH_MAX_RECORDS": "150"}  # many small batches: kills land mid-stream
STREAM_SECONDS = 12  # the scores arrive over this long: at full speed the service ingests them in ~2 s,
# faster than a poll of its API could see a partial count on a quicker machine
BAD = [b"{oops", b'{"classifier_id":"alpha","item_id":"x","score":NaN}', b'{"classifier_id":"alpha","score":1}']


async def test_one_instance_sigkilled_mid_ingest_and_mid_labelling(kafka_bootstrap, redis_backend, unique_name,
                                                                   tmp_path):
    classifiers, per = ("alpha", "beta.v2", "gamma:3"), 8000
    work = await new_workload(kafka_bootstrap, redis_backend, unique_name, 3)
    port = find_free_port()
    service = ServiceProcess(work.env(port, "solo", **SETTINGS), port, str(tmp_path / "service.log"))
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=False, linger_ms=20)
    await producer.start()
    producing = asyncio.create_task(work.produce(producer, classifiers, per, BAD, seconds=STREAM_SECONDS))
    reviewer = asyncio.create_task(work.review(producer, unique_name("rev")))
    try:
        docs = await _killed_twice_then_converged(service, port, classifiers, len(classifiers) * per, 120, producing)
        started = time.monotonic()
        assert service.terminate() == 0, "SIGTERM must close cleanly"
        assert time.monotonic() - started < 10, "SIGTERM must close within a few seconds"
    finally:
        await _stopped(service, producing, reviewer)
    dead = await read_topic(kafka_bootstrap, work.topics["dlq"], unique_name("dlq-reader"), timeout=10)
    await producer.stop()
    work.assert_exact(docs, per)
    originals = {base64.b64decode(d["original"]) for d in dead if d["topic"] == work.topics["scores"]}
    assert set(BAD) <= originals  # dead letters are at-least-once: a replay may repeat one
    assert all(d["reason"] and d["detail"] and isinstance(d["offset"], int) for d in dead)


async def test_sigkilled_while_sampling_predicted_negatives(kafka_bootstrap, redis_url, unique_name, tmp_path):
    """With recall, F1 and accuracy the same records go to two states (both sides of the
    threshold); kills mid-ingest and mid-labelling replay batches with negatives and nothing is
    counted twice on either side."""
    classifiers, per = ("delta",), 20000
    work = await new_workload(kafka_bootstrap, RedisBackend(redis_url, False), unique_name, 3)
    port = find_free_port()
    settings = {**SETTINGS, "THRESHOLD": "0.75", "METRICS": "precision,recall,f1,accuracy"}
    service = ServiceProcess(work.env(port, "solo", **settings), port, str(tmp_path / "service.log"))
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=False, linger_ms=20)
    await producer.start()
    producing = asyncio.create_task(work.produce(producer, classifiers, per, seconds=STREAM_SECONDS))
    reviewer = asyncio.create_task(work.review(producer, unique_name("rev")))
    try:
        docs = await _killed_twice_then_converged(service, port, classifiers, per, 150, producing)
    finally:
        await _stopped(service, producing, reviewer)
    await producer.stop()
    work.assert_exact(docs, per)
    doc = docs["delta"]
    negatives = [s for s in doc["strata"] if s["side"] == "negative"]
    assert negatives and sum(s["labels"] for s in negatives) > 0
    assert sum(s["items"] for s in doc["strata"]) == per  # each record on exactly one side, once
    assert all(doc["metrics"][m]["estimate"] is not None for m in ("recall", "f1", "accuracy"))


@pytest.mark.parametrize("instances, redis_backend", [(2, "redis"), (3, "redis"), (3, "cluster")],
                         indirect=["redis_backend"])
async def test_instances_killed_for_good_survivors_take_over(instances, kafka_bootstrap, redis_backend, unique_name,
                                                             tmp_path):
    classifiers, per = tuple(f"clf-{i}" for i in range(6)), 4000
    work = await new_workload(kafka_bootstrap, redis_backend, unique_name, 6)
    ports = [find_free_port() for _ in range(instances)]
    procs = [ServiceProcess(work.env(p, f"inst-{i}", **SETTINGS), p, str(tmp_path / f"i{i}.log"))
             for i, p in enumerate(ports)]
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=False, linger_ms=20)
    await producer.start()
    producing = asyncio.create_task(work.produce(producer, classifiers, per, BAD, seconds=STREAM_SECONDS))
    reviewer = asyncio.create_task(work.review(producer, unique_name("rev")))
    try:
        for p in procs:
            p.start()
        last = ports[-1]
        total = len(classifiers) * per
        await wait_for(lambda: _between(scores_counted(last, classifiers), 0, total), 60, "partial ingest")
        procs[0].kill9()  # mid-stream
        await producing
        if instances == 3:
            await wait_for(lambda: _at_least(labels_folded(last, classifiers), 6), 90, "labels being folded")
            procs[1].kill9()  # mid-labelling
        docs = await wait_for(lambda: converged(last, classifiers), 150, "the survivors to converge")
        # each classifier's gauges come from exactly one live instance
        exporters = {cid: [] for cid in classifiers}
        for i, p in enumerate(procs):
            if p.alive:
                _, body = await http_get(p.port, "/metrics")
                for cid in classifiers:
                    if f'stratameter_scores_total{{classifier="{cid}"}}' in body.decode():
                        exporters[cid].append(i)
        assert all(len(v) == 1 for v in exporters.values()), exporters
        # service-wide series come from exactly one live instance, so a sum over replicas is right
        invalid = [sum(float(line.rsplit(" ", 1)[1]) for line in body.splitlines()
                       if line.startswith("stratameter_invalid_messages_total{"))
                   for body in [(await http_get(p.port, "/metrics"))[1].decode() for p in procs if p.alive]]
        assert sorted(invalid) == [0.0] * (len(invalid) - 1) + [float(len(BAD))], invalid
    finally:
        producing.cancel()
        reviewer.cancel()
        await asyncio.gather(producing, reviewer, return_exceptions=True)
        for p in procs:
            if p.alive:
                p.kill9()
        await producer.stop()
    work.assert_exact(docs, per)


async def _killed_twice_then_converged(service, port: int, classifiers, total: int, timeout: float,
                                       producing: asyncio.Task) -> dict:
    """Start; kill -9 mid-ingest (some but not all of `total` scores counted, while `producing`
    still sends them); restart; kill -9 once labels are being folded; restart; the converged
    documents."""
    service.start()
    await wait_for(lambda: _between(scores_counted(port, classifiers), 0, total), 60, "partial ingest")
    service.kill9()
    await producing
    service.start()
    await wait_for(lambda: _at_least(labels_folded(port, classifiers), 6), 90, "labels being folded")
    service.kill9()
    service.start()
    return await wait_for(lambda: converged(port, classifiers), timeout, "convergence after restarts")


async def _stopped(service, *tasks: asyncio.Task) -> None:
    """Cancel the producer and reviewer tasks; kill the service if it still runs."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    if service.alive:
        service.kill9()


async def _between(value, lo: int, hi: int) -> bool:
    return lo < await value < hi


async def _at_least(value, n: int) -> bool:
    return await value >= n
