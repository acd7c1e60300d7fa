"""Integration tests of the real backends the service runs on (Kafka protocol, Redis).

They exercise the fixtures of ``conftest.py`` and pin down the broker behaviour the
service relies on: keyed partitioning, consumer groups with manual commits, resuming at
committed offsets, Lua scripts in Redis, and clients riding out a network outage.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import defaultdict

import pytest
import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from redis.exceptions import ConnectionError as RedisConnectionError

from stratameter.embedded import EmbeddedKafkaProxy, EmbeddedRedis, create_topics, leave_group_on_stop

pytestmark = pytest.mark.integration

N_RECORDS = 1000
N_KEYS = 37


def make_consumer(bootstrap: str, topic: str, group: str, **kwargs) -> AIOKafkaConsumer:
    options = dict(
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=6000,
        heartbeat_interval_ms=500,
        request_timeout_ms=5000,
        retry_backoff_ms=100,
    )
    options.update(kwargs)
    return AIOKafkaConsumer(topic, **options)


async def start_consumer(consumer: AIOKafkaConsumer) -> AIOKafkaConsumer:
    await consumer.start()
    return leave_group_on_stop(consumer)


async def consume(consumer: AIOKafkaConsumer, count: int, timeout: float = 20.0) -> list:
    """At least *count* records (fewer only on timeout), in arrival order."""
    records: list = []
    deadline = time.monotonic() + timeout
    while len(records) < count and time.monotonic() < deadline:
        batch = await consumer.getmany(timeout_ms=500, max_records=min(200, count - len(records)))
        for partition_records in batch.values():
            records.extend(partition_records)
    return records


async def test_keyed_records_roundtrip_and_resume_at_committed_offsets(kafka_bootstrap, unique_name):
    topic, group = unique_name("records"), unique_name("group")
    await create_topics(kafka_bootstrap, [topic], partitions=3)
    tps = [TopicPartition(topic, p) for p in range(3)]

    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        futures = []
        for i in range(N_RECORDS):
            key = f"key-{i % N_KEYS}"
            value = json.dumps({"i": i, "key": key}).encode()
            futures.append(await producer.send(topic, value=value, key=key.encode()))
        produced = {i: await fut for i, fut in enumerate(futures)}  # i -> RecordMetadata
    finally:
        await producer.stop()

    end_offsets = defaultdict(int)
    partition_of_key: dict[str, int] = {}
    for i, meta in produced.items():
        end_offsets[meta.partition] = max(end_offsets[meta.partition], meta.offset + 1)
        key = f"key-{i % N_KEYS}"
        assert partition_of_key.setdefault(key, meta.partition) == meta.partition, "key moved partition"
    assert sorted(end_offsets) == [0, 1, 2], "37 keys should land on all 3 partitions"
    assert sum(end_offsets.values()) == N_RECORDS

    # 1st consumer: read roughly 40 %, commit exactly what it consumed, leave.
    first = await start_consumer(make_consumer(kafka_bootstrap, topic, group))
    try:
        part1 = await consume(first, 400)
        assert len(part1) >= 400
        await first.commit()
        committed = {tp: await first.committed(tp) for tp in tps}
        positions = {tp: await first.position(tp) for tp in tps}
    finally:
        await first.stop()
    assert committed == positions
    assert sum(committed.values()) == len(part1)

    # 2nd consumer, same group: starts exactly at the committed offsets and reads the rest.
    second = await start_consumer(make_consumer(kafka_bootstrap, topic, group))
    try:
        assert {tp: await second.committed(tp) for tp in tps} == committed
        part2 = await consume(second, N_RECORDS - len(part1))
        first_offset = {}
        for record in part2:
            first_offset.setdefault(TopicPartition(record.topic, record.partition), record.offset)
        for tp in tps:
            if committed[tp] < end_offsets[tp.partition]:
                assert first_offset[tp] == committed[tp], f"{tp} resumed at {first_offset[tp]}, committed {committed[tp]}"
            else:
                assert tp not in first_offset
        await second.commit()
        assert {tp: await second.committed(tp) for tp in tps} == {tp: end_offsets[tp.partition] for tp in tps}
    finally:
        await second.stop()

    # Together: every record exactly once, with the offsets the producer was told,
    # and each key's records in production order.
    records = part1 + part2
    values = [json.loads(r.value) for r in records]
    assert sorted(v["i"] for v in values) == list(range(N_RECORDS))
    per_key: dict[bytes, list[int]] = defaultdict(list)
    for record, value in zip(records, values):
        meta = produced[value["i"]]
        assert (record.partition, record.offset) == (meta.partition, meta.offset)
        assert record.key == value["key"].encode()
        per_key[record.key].append(value["i"])
    assert all(seq == sorted(seq) for seq in per_key.values())

    # 3rd consumer, same group: nothing left to read, then sees only new records.
    third = await start_consumer(make_consumer(kafka_bootstrap, topic, group))
    try:
        await third.getmany(timeout_ms=500)  # completes the group join
        assert {tp: await third.position(tp) for tp in tps} == {tp: end_offsets[tp.partition] for tp in tps}
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
        await producer.start()
        try:
            for i in range(N_RECORDS, N_RECORDS + 10):
                await producer.send_and_wait(topic, json.dumps({"i": i}).encode(), key=b"late")
        finally:
            await producer.stop()
        late = await consume(third, 10, timeout=10)
        assert [json.loads(r.value)["i"] for r in late] == list(range(N_RECORDS, N_RECORDS + 10))
    finally:
        await third.stop()


async def test_redis_ping_and_lua_roundtrip(redis_url, unique_name):
    prefix = unique_name("redis")
    client = aioredis.from_url(redis_url)
    try:
        assert await client.ping() is True
        # Atomic "add to a counter hash, record the caller, return the new total" script.
        script = """
        local total = redis.call('HINCRBY', KEYS[1], ARGV[1], tonumber(ARGV[2]))
        redis.call('RPUSH', KEYS[2], ARGV[1])
        return {total, redis.call('LLEN', KEYS[2])}
        """
        keys = [f"{prefix}:counts", f"{prefix}:log"]
        assert await client.eval(script, 2, *keys, "stratum-3", 5) == [5, 1]
        assert await client.eval(script, 2, *keys, "stratum-3", 2) == [7, 2]
        registered = client.register_script(script)  # EVALSHA, falling back to EVAL
        assert await registered(keys=keys, args=["stratum-1", 1]) == [1, 3]
        assert await client.hgetall(keys[0]) == {b"stratum-3": b"7", b"stratum-1": b"1"}
        assert await client.lrange(keys[1], 0, -1) == [b"stratum-3", b"stratum-3", b"stratum-1"]
        await client.delete(*keys)
    finally:
        await client.aclose()


async def test_embedded_redis_restart_same_port():
    with EmbeddedRedis() as server:
        client = aioredis.from_url(server.url, socket_timeout=2)
        try:
            await client.set("k", "v")
            port = server.port
            server.stop()
            with pytest.raises(RedisConnectionError):
                await client.ping()
            server.start()
            assert server.port == port
            assert await client.ping() is True  # the pool reconnects
            assert await client.get("k") is None  # no persistence
        finally:
            await client.aclose()


async def test_clients_ride_out_proxy_outage(kafka_bootstrap, kafka_proxy: EmbeddedKafkaProxy, unique_name):
    topic, group = unique_name("outage"), unique_name("group")
    await create_topics(kafka_bootstrap, [topic], partitions=2)

    direct = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    producer = AIOKafkaProducer(
        bootstrap_servers=kafka_proxy.bootstrap, request_timeout_ms=5000, retry_backoff_ms=100
    )
    consumer = make_consumer(kafka_proxy.bootstrap, topic, group)
    await direct.start()
    await producer.start()
    try:
        await start_consumer(consumer)
        await producer.send_and_wait(topic, b"before", key=b"a")
        assert [r.value for r in await consume(consumer, 1)] == [b"before"]
        await consumer.commit()

        kafka_proxy.stop()
        await direct.send_and_wait(topic, b"during-direct", key=b"a")
        pending = await producer.send(topic, b"during-proxy", key=b"b")
        assert await consume(consumer, 1, timeout=1.5) == []
        assert not pending.done()

        kafka_proxy.start()  # same port
        meta = await asyncio.wait_for(pending, timeout=10)
        assert meta.topic == topic
        after = await consume(consumer, 2, timeout=15)
        assert sorted(r.value for r in after) == [b"during-direct", b"during-proxy"]
        await consumer.commit()
    finally:
        await consumer.stop()
        await producer.stop()
        await direct.stop()
