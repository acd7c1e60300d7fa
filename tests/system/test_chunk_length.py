"""A chunk id counts chunks of `CHUNK_SECONDS` since the epoch, so the state under a key prefix is
only readable with the chunk length it was written with.  Before the service refused another one,
600-second chunks followed by 3600-second ones read as chunks in the year 2311, counted as the
newest: the retention purged the reservoir of the chunk being sampled and never purged again."""

from __future__ import annotations

import asyncio
import contextlib
import time
from urllib.parse import urlsplit

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from redis.asyncio import Redis

from stratameter.app.runner import Service
from stratameter.config import load_settings
from stratameter.embedded import find_free_port
from stratameter.errors import StartupError
from stratameter.state.keys import Keys
from tests.harness import service_topics

pytestmark = pytest.mark.integration


async def test_the_service_refuses_another_chunk_length_than_its_state_was_written_with(
        kafka_bootstrap, redis_url, unique_name):
    prefix = unique_name("len")

    def service(chunk_seconds: int) -> Service:
        return Service(load_settings({"STRATAMETER_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
                                      "STRATAMETER_REDIS_URL": redis_url, "STRATAMETER_REDIS_KEY_PREFIX": prefix,
                                      "STRATAMETER_CHUNK_SECONDS": str(chunk_seconds)}))

    first = service(600)
    await first.start()  # the first start notes the length
    await first.stop()
    longer = service(3600)
    with pytest.raises(StartupError) as info:
        await longer.start()
    await longer.stop()
    assert str(info.value) == (
        f"STRATAMETER_CHUNK_SECONDS is 3600, but the state under STRATAMETER_REDIS_KEY_PREFIX {prefix!r} was "
        "written with 600-second chunks: keep 600, or give the new length a key prefix of its own (its state "
        "starts empty)")
    again = service(600)
    await again.start()
    await again.stop()


@contextlib.asynccontextmanager
async def forwarding(port: int, target: str):
    """TCP on 127.0.0.1:`port` forwarded to `target` (a Redis URL's host and port) from now on."""
    url = urlsplit(target)

    async def pipe(reader, writer):
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()

    async def handle(reader, writer):
        up_reader, up_writer = await asyncio.open_connection(url.hostname, url.port)
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer), return_exceptions=True)

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    try:
        yield
    finally:
        server.close()


async def test_a_service_started_while_redis_is_down_checks_the_length_before_it_writes(
        kafka_bootstrap, redis_url, unique_name):
    """Redis unreachable at start (readiness says so, the service starts): the loops that write
    wait for it, check the chunk length first, and end on another one (the process then exits 1)
    with nothing written, though a score awaits them."""
    prefix = unique_name("len")
    keys = Keys(prefix)
    upstream = Redis.from_url(redis_url)
    await upstream.hset(keys.settings, "chunk_seconds", 600)
    topics = await service_topics(kafka_bootstrap, unique_name, 1)
    port = find_free_port()
    db = urlsplit(redis_url).path or "/0"
    service = Service(load_settings({
        "STRATAMETER_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap, "STRATAMETER_KAFKA_CONSUMER_GROUP": unique_name("g"),
        "STRATAMETER_REDIS_URL": f"redis://127.0.0.1:{port}{db}", "STRATAMETER_REDIS_KEY_PREFIX": prefix,
        "STRATAMETER_TOPIC_SCORES": topics["scores"], "STRATAMETER_TOPIC_LABEL_REQUESTS": topics["requests"],
        "STRATAMETER_TOPIC_LABELS": topics["labels"], "STRATAMETER_TOPIC_DEAD_LETTER": topics["dlq"],
        "STRATAMETER_CHUNK_SECONDS": "3600"}))
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    await producer.send_and_wait(topics["scores"], key=b"c", value=orjson.dumps(
        {"classifier_id": "c", "item_id": "i", "score": 0.9, "event_time": int(time.time() * 1000)}))
    await producer.stop()
    await service.start()
    tasks = service.spawn()
    try:
        await asyncio.sleep(1)
        assert not any(t.done() for t in tasks)  # waiting for Redis
        async with forwarding(port, redis_url):
            done, _ = await asyncio.wait(tasks, timeout=20, return_when=asyncio.FIRST_EXCEPTION)
        ended = [t for t in done if not t.cancelled() and t.exception() is not None]
        assert ended and all(isinstance(t.exception(), StartupError) for t in ended)
        assert "STRATAMETER_CHUNK_SECONDS is 3600" in str(ended[0].exception())
        written = [k async for k in upstream.scan_iter(f"{prefix}:*") if b":probe:" not in k]  # readiness's own
        assert written == [keys.settings.encode()]
    finally:
        service.stopping.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        await service.stop()
        await upstream.aclose()
