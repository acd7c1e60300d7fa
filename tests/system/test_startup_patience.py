"""Start-up with a Kafka or a Redis that is not there yet (`app.patience`): `stratameter run` retries
it with backoff, not ready meanwhile, and starts once it answers; past
STRATAMETER_STARTUP_TIMEOUT_SECONDS it exits 1 with one line naming the backend and the setting."""

from __future__ import annotations

import asyncio
import os
import time

import orjson
from aiokafka import AIOKafkaProducer

from stratameter.embedded import find_free_port
from tests.harness import ServiceProcess, http_get, service_env, service_topics, wait_for


def _process(kafka: str, redis_url: str, topics: dict, unique_name, tmp_path, **settings: str) -> ServiceProcess:
    port = find_free_port()
    env = service_env(kafka, redis_url, topics, unique_name, HTTP_PORT=str(port), HTTP_HOST="127.0.0.1", **settings)
    return ServiceProcess({**os.environ, **{f"STRATAMETER_{k}": v for k, v in env.items()}}, port,
                          str(tmp_path / "service.log"))


async def _readyz(service: ServiceProcess) -> int:
    try:
        return (await http_get(service.port, "/readyz"))[0]
    except OSError:
        return 0  # not listening (yet, or any more)


async def _exits_naming_the_setting(service: ServiceProcess, backend: str, timeout_s: int) -> None:
    started = time.monotonic()
    service.start()
    try:
        await wait_for(lambda: _answers(service, 503), 15, "/readyz 503 while the backend is missing")
        while service.alive and time.monotonic() - started < timeout_s + 20:
            await asyncio.sleep(0.2)
        assert service.proc.returncode == 1, service.log_tail()
        assert time.monotonic() - started >= timeout_s
    finally:
        if service.alive:
            service.kill9()
    log = service.log_tail()
    assert f"{backend} did not answer within STRATAMETER_STARTUP_TIMEOUT_SECONDS ({timeout_s} s)" in log, log
    assert f"{backend} not reachable at start, retrying in 1 s" in log, log


async def _answers(service: ServiceProcess, status: int) -> bool:
    return await _readyz(service) == status


async def test_kafka_that_never_answers_ends_start_up_after_the_timeout(kafka_bootstrap, redis_url, unique_name,
                                                                        tmp_path):
    topics = await service_topics(kafka_bootstrap, unique_name, 1)
    nowhere = f"127.0.0.1:{find_free_port()}"
    service = _process(nowhere, redis_url, topics, unique_name, tmp_path, STARTUP_TIMEOUT_SECONDS="6",
                       LOG_LEVEL="WARNING")
    await _exits_naming_the_setting(service, "Kafka", 6)


async def test_redis_that_never_answers_ends_start_up_after_the_timeout(kafka_bootstrap, unique_name, tmp_path):
    topics = await service_topics(kafka_bootstrap, unique_name, 1)
    nowhere = f"redis://127.0.0.1:{find_free_port()}/0"
    service = _process(kafka_bootstrap, nowhere, topics, unique_name, tmp_path, STARTUP_TIMEOUT_SECONDS="6",
                       LOG_LEVEL="WARNING")
    await _exits_naming_the_setting(service, "Redis", 6)


async def test_kafka_that_comes_up_late_is_waited_for(kafka_bootstrap, kafka_proxy, redis_url, unique_name, tmp_path):
    topics = await service_topics(kafka_bootstrap, unique_name, 1)
    kafka_proxy.stop()
    service = _process(kafka_proxy.bootstrap, redis_url, topics, unique_name, tmp_path, STARTUP_TIMEOUT_SECONDS="120",
                       LOG_LEVEL="WARNING").start()
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=False)
    await producer.start()
    try:
        await wait_for(lambda: _answers(service, 503), 15, "/readyz 503 while Kafka is missing")
        await asyncio.sleep(4)
        assert service.alive and "Kafka not reachable at start" in service.log_tail()
        kafka_proxy.start()
        await wait_for(lambda: _answers(service, 200), 60, "ready once Kafka answers")
        await producer.send_and_wait(topics["scores"], key=b"late", value=orjson.dumps(
            {"classifier_id": "late", "item_id": "i", "score": 0.9, "event_time": int(time.time() * 1000)}))
        await wait_for(lambda: _scored(service, "late"), 30, "the score counted")
        assert service.terminate() == 0
    finally:
        await producer.stop()
        if service.alive:
            service.kill9()


async def _scored(service: ServiceProcess, cid: str) -> bool:
    status, body = await http_get(service.port, f"/v1/classifiers/{cid}")
    return status == 200 and orjson.loads(body)["scores"] == 1
