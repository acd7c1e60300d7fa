"""`stratameter run` on a Redis Cluster whose masters are killed with SIGKILL mid-stream and
restarted (AOF with ``appendfsync always``: every acknowledged write survives; the scripts do
not, so the service meets NOSCRIPT and reloads them).  While a master is down its slots are
uncovered and the cluster refuses every command (``cluster-require-full-coverage``, the
default): the service retries its batches and resumes.  Afterwards: no score lost or counted
twice, no label folded twice, no item requested twice."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaProducer
from redis.crc import key_slot

from stratameter.embedded import EmbeddedRedisCluster, find_free_port
from tests.harness import (RedisBackend, ServiceProcess, converged, labels_folded, new_workload, progress,
                           scores_counted, wait_for)

pytestmark = pytest.mark.integration

SETTINGS = {"DELTA": "0.06", "CONFIDENCE": "0.99", "MAX_LABELS_PER_HOUR": "100000", "BATCH_MAX_RECORDS": "150"}
STREAM_SECONDS = 12


@pytest.fixture
def durable_cluster():
    with EmbeddedRedisCluster(durable=True) as cluster:
        yield cluster


async def test_masters_sigkilled_mid_stream_and_restarted(kafka_bootstrap, durable_cluster, unique_name, tmp_path):
    classifiers, per = ("alpha", "beta.v2", "gamma:3", "epsilon"), 5000
    masters = {min(key_slot(f"{{{cid}}}".encode()) // (16384 // 3), 2) for cid in classifiers}
    assert masters == {0, 1, 2}  # every master holds a classifier (slots split in thirds)
    work = await new_workload(kafka_bootstrap, RedisBackend(durable_cluster.url, True), unique_name, 3)
    port = find_free_port()
    service = ServiceProcess(work.env(port, "solo", **SETTINGS), port, str(tmp_path / "service.log"))
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=False, linger_ms=20)
    await producer.start()
    producing = asyncio.create_task(work.produce(producer, classifiers, per, seconds=STREAM_SECONDS))
    reviewer = asyncio.create_task(work.review(producer, unique_name("rev")))
    total = len(classifiers) * per
    try:
        service.start()
        await wait_for(lambda: _between(scores_counted(port, classifiers), 0, total), 60, "partial ingest")
        durable_cluster.kill_node(1)  # mid-ingest
        await asyncio.sleep(3)  # past the node timeout: the cluster is down
        durable_cluster.restart_node(1)
        await producing
        await wait_for(lambda: _at_least(labels_folded(port, classifiers), 6), 90, "labels being folded")
        durable_cluster.kill_node(2)  # mid-labelling
        await asyncio.sleep(3)
        durable_cluster.restart_node(2)
        docs = await wait_for(lambda: converged(port, classifiers), 150, "convergence after the restarts")
        assert service.alive, "the service must ride out a master's restart"
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nreviewer answered {len(work.answered)}; service: "
                             f"{await progress(port, classifiers) if service.alive else 'dead'}\n"
                             f"service log:\n{service.log_tail()}") from None
    finally:
        producing.cancel()
        reviewer.cancel()
        await asyncio.gather(producing, reviewer, return_exceptions=True)
        if service.alive:
            service.kill9()
        await producer.stop()
    work.assert_exact(docs, per)


async def _between(value, lo: int, hi: int) -> bool:
    return lo < await value < hi


async def _at_least(value, n: int) -> bool:
    return await value >= n
