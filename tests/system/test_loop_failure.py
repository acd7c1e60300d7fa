"""A loop of `stratameter run` that ends on an exception nothing inside it handles stops the
process with exit code 1 and a log line saying which loop and why.  Before, the consume pipeline's
task ended silently: the process went on answering its probes and holding its partitions and
leases with nothing ingested, and nothing in the log until it was stopped."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from redis.asyncio import Redis

from stratameter.embedded import find_free_port
from stratameter.ingest.aggregate import chunk_of
from stratameter.state.keys import Keys
from tests.harness import RedisBackend, ServiceProcess, http_get, new_workload, wait_for

pytestmark = pytest.mark.integration


async def test_the_process_stops_when_its_consume_pipeline_fails(kafka_bootstrap, redis_url, unique_name, tmp_path):
    work = await new_workload(kafka_bootstrap, RedisBackend(redis_url, False), unique_name, 3)
    now_ms = int(time.time() * 1000)
    # strata boundaries the ingest cannot parse (no version writes them): opening the chunk raises
    redis = Redis.from_url(redis_url)
    await redis.hset(Keys(work.prefix).chunk_meta("bad", int(chunk_of([now_ms], 3600)[0])), "cuts", "not json")
    await redis.aclose()
    port = find_free_port()
    service = ServiceProcess(work.env(port, "solo"), port, str(tmp_path / "service.log")).start()
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=False)
    await producer.start()
    try:
        async def ready():
            try:
                return (await http_get(port, "/readyz"))[0] == 200
            except OSError:
                return False

        await wait_for(ready, 60, "the service ready")
        for i in range(50):
            await producer.send(work.topics["scores"], key=b"bad", value=orjson.dumps(
                {"classifier_id": "bad", "item_id": f"i{i}", "score": 0.9, "event_time": now_ms}))
        await producer.flush()

        async def exited():
            return not service.alive

        await wait_for(exited, 60, f"the service to exit; its log:\n{service.log_tail()}")
    finally:
        await producer.stop()
        if service.alive:
            service.kill9()
    assert service.proc.returncode == 1, service.log_tail()
    log = service.log_tail(200)
    assert "a loop of the process ended before it was told to stop" in log and "consume_forever" in log, log
    assert "JSONDecodeError" in log, log
