"""Running the service in-process against the test broker and Redis, plus a
reviewer that answers label requests; shared by the service tests."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from service.config import load_settings
from service.embedded import create_topics, find_free_port, leave_group_on_stop


@dataclass
class Running:
    service: object
    port: int
    topics: dict[str, str]
    producer: AIOKafkaProducer
    bootstrap: str

    async def get(self, path: str) -> tuple[int, bytes]:
        return await http_get(self.port, path)

    async def send_score(self, **fields) -> None:
        await self.producer.send(self.topics["scores"], key=fields["classifier_id"].encode(), value=orjson.dumps(fields))

    async def send_label(self, request_id: str, label, key: bytes | None = b"any") -> None:
        await self.producer.send(self.topics["labels"], key=key,
                                 value=orjson.dumps({"request_id": request_id, "label": label}))


async def http_get(port: int, path: str) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    raw = await reader.read()
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


@contextlib.asynccontextmanager
async def running_service(kafka_bootstrap: str, redis_url: str, unique_name, service_bootstrap: str | None = None,
                          **settings: str):
    """Topics, settings (STRATAMETER_ names without the prefix), the service, its HTTP server.

    `service_bootstrap` lets the service reach Kafka through another address (a proxy)
    while the test's producer talks to the broker directly."""
    from service.api.http import serve
    from service.app.runner import Service

    topics = {name: unique_name(name) for name in ("scores", "requests", "labels", "dlq")}
    await create_topics(kafka_bootstrap, list(topics.values()), partitions=3)
    port = find_free_port()
    env = {
        "KAFKA_BOOTSTRAP_SERVERS": service_bootstrap or kafka_bootstrap, "KAFKA_CONSUMER_GROUP": unique_name("group"),
        "KAFKA_SESSION_TIMEOUT_MS": "6000", "REDIS_URL": redis_url, "REDIS_KEY_PREFIX": unique_name("sm"),
        "TOPIC_SCORES": topics["scores"], "TOPIC_LABEL_REQUESTS": topics["requests"],
        "TOPIC_LABELS": topics["labels"], "TOPIC_DEAD_LETTER": topics["dlq"], "HTTP_PORT": str(port),
        **settings,
    }
    service = Service(load_settings({f"STRATAMETER_{k}": v for k, v in env.items()}))
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=False)
    await producer.start()
    server = await serve(service, "127.0.0.1", port)
    await service.start()
    tasks = [asyncio.create_task(service.consume_forever()), asyncio.create_task(service.requests_forever()),
             asyncio.create_task(service.probe_forever())]
    try:
        yield Running(service, port, topics, producer, kafka_bootstrap)
    finally:
        service.stopping.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        server.close()
        await service.stop()
        await producer.stop()


@dataclass
class Reviewer:
    """Consumes label requests; `answer(request) -> label | None | ...` decides (Ellipsis = ignore)."""

    running: Running
    group: str
    answer: object
    requests: list[dict] = field(default_factory=list)

    async def __aenter__(self) -> "Reviewer":
        self.consumer = AIOKafkaConsumer(self.running.topics["requests"], bootstrap_servers=self.running.bootstrap,
                                         group_id=self.group, auto_offset_reset="earliest",
                                         session_timeout_ms=6000, heartbeat_interval_ms=500)
        await self.consumer.start()
        leave_group_on_stop(self.consumer)
        self.task = asyncio.create_task(self._run())
        return self

    async def _run(self) -> None:
        async for rec in self.consumer:
            req = orjson.loads(rec.value)
            self.requests.append(req)
            label = await self.answer(req) if asyncio.iscoroutinefunction(self.answer) else self.answer(req)
            if label is not ...:
                await self.running.send_label(req["request_id"], label)

    async def __aexit__(self, *exc) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        await self.consumer.stop()


async def wait_for(cond, timeout: float, what: str):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        value = await cond()
        if value:
            return value
        await asyncio.sleep(0.3)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
