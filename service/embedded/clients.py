"""Kafka clients for the tools on these backends (demo, bench, soak, tests): creating
topics, consumers tuned for tansu's consumer groups, and a reviewer that answers label
requests through the wire codec."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Iterable

from stratameter.schemas.outbound import decode_label_request, label_record_bytes

from ..app.group import leave_group_on_stop
from .process import BackendError

#: Consumer settings for tansu's groups (see ``broker``): read from the start, and a short
#: session, since every JoinGroup round waits about half of it.
GROUP_CONSUMER_DEFAULTS = {"auto_offset_reset": "earliest", "session_timeout_ms": 6000, "heartbeat_interval_ms": 500}


async def create_topics(
    bootstrap: str,
    names: Iterable[str],
    partitions: int = 3,
    replication_factor: int = 1,
    timeout: float = 10.0,
) -> None:
    """Create *names* with *partitions* each; an already existing topic is fine.

    Waits until the metadata lists every topic with the expected partition count.
    Raises :class:`BackendError` on any other CreateTopics error (or if an existing
    topic has a different partition count).
    """
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    names = list(dict.fromkeys(names))
    if not names:
        return
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout * 1000))
    await admin.start()
    try:
        response = await admin.create_topics(
            [NewTopic(name, partitions, replication_factor) for name in names],
            timeout_ms=int(timeout * 1000),
        )
        errors, existing = [], set()
        for entry in response.topic_errors:
            topic, code = entry[0], entry[1]
            message = entry[2] if len(entry) > 2 else None
            if code == 36:  # TOPIC_ALREADY_EXISTS
                existing.add(topic)
            elif code != 0:
                errors.append(f"{topic}: error {code} {message or ''}".strip())
        if errors:
            raise BackendError("CreateTopics failed: " + "; ".join(errors))
        deadline = time.monotonic() + timeout
        while True:
            described = await admin.describe_topics(names)
            counts = {d["topic"]: len(d["partitions"]) for d in described if d["error_code"] == 0}
            wrong = {n: counts[n] for n in existing if n in counts and counts[n] != partitions}
            if wrong:
                raise BackendError(f"topics already exist with other partition counts: {wrong} (wanted {partitions})")
            if all(counts.get(n) == partitions for n in names):
                return
            if time.monotonic() > deadline:
                raise BackendError(f"topics not ready after {timeout}s: want {partitions} partitions, have {counts}")
            await asyncio.sleep(0.05)
    finally:
        await admin.close()


def create_topics_sync(bootstrap: str, names: Iterable[str], partitions: int = 3, **kwargs: Any) -> None:
    """:func:`create_topics` for code without a running event loop."""
    asyncio.run(create_topics(bootstrap, names, partitions, **kwargs))


async def start_group_consumer(*topics: str, **options: Any) -> Any:
    """A started ``AIOKafkaConsumer`` of *topics* with `GROUP_CONSUMER_DEFAULTS` (*options*,
    e.g. ``bootstrap_servers``, ``group_id``, win) that sends LeaveGroup on ``stop()`` even
    in tansu's generation 0 (`leave_group_on_stop`), so the group's next consumer need not
    wait a session timeout."""
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(*topics, **{**GROUP_CONSUMER_DEFAULTS, **options})
    await consumer.start()
    leave_group_on_stop(consumer)
    return consumer


@contextlib.asynccontextmanager
async def group_consumer(*topics: str, **options: Any) -> AsyncIterator[Any]:
    """`start_group_consumer`, stopped on leaving the ``async with`` block."""
    consumer = await start_group_consumer(*topics, **options)
    try:
        yield consumer
    finally:
        await consumer.stop()


async def answer_label_requests(consumer: Any, producer: Any, labels_topic: str, answer: Callable[[Any], Any],
                                key: bytes | None = None) -> None:
    """A reviewer: every label request *consumer* reads, decoded by the codec
    (`decode_label_request`, a `stratameter.schemas.messages.LabelRequest`), is answered with
    ``answer(request)`` (awaited if it returns an awaitable): True or False, None for
    skipped, Ellipsis for no answer.  Answers go to *labels_topic* (with *key*) as
    `label_record_bytes`.  Runs until *consumer* ends or the task is cancelled."""
    async for record in consumer:
        request = decode_label_request(record.value)
        label = answer(request)
        if inspect.isawaitable(label):
            label = await label
        if label is not ...:
            await producer.send(labels_topic, key=key, value=label_record_bytes(request.request_id, label))
