"""`stratameter run` as a real subprocess, killed with SIGKILL mid-ingest and
mid-labelling and restarted: no score lost or counted twice, no label folded
twice, no item requested twice, dead letters carry the original and a reason."""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import subprocess
import sys
import time

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from service.embedded import create_topics, find_free_port, leave_group_on_stop

pytestmark = pytest.mark.integration

CLASSIFIERS = ("alpha", "beta.v2", "gamma:3")
PER_CLASSIFIER = 8000


async def _get(port: int, path: str) -> tuple[int, dict | list | None]:
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return 0, None
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    raw = await reader.read()
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ")[1]) if head else 0
    return status, (orjson.loads(body) if body and status == 200 else None)


class ServiceProcess:
    def __init__(self, env: dict[str, str], port: int, log_path: str) -> None:
        self.env, self.port, self.log_path = env, port, log_path
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "service.cli", "run"], env=self.env,
                                     stdout=log, stderr=log)

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def terminate(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(20)

    async def scores(self) -> dict[str, int]:
        out = {}
        for cid in CLASSIFIERS:
            status, doc = await _get(self.port, f"/v1/classifiers/{cid}")
            out[cid] = doc["scores"] if status == 200 else 0
        return out


async def _wait(cond, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = await cond()
        if value:
            return value
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


async def test_sigkill_mid_ingest_and_mid_labelling_counts_exactly_once(kafka_bootstrap, redis_url, unique_name,
                                                                       tmp_path):
    topics = {name: unique_name(name) for name in ("scores", "requests", "labels", "dlq")}
    await create_topics(kafka_bootstrap, list(topics.values()), partitions=3)
    port = find_free_port()
    prefix = unique_name("sm")
    env = {**os.environ,
           "STRATAMETER_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
           "STRATAMETER_KAFKA_CONSUMER_GROUP": unique_name("group"),
           "STRATAMETER_KAFKA_SESSION_TIMEOUT_MS": "6000",
           "STRATAMETER_REDIS_URL": redis_url,
           "STRATAMETER_REDIS_KEY_PREFIX": prefix,
           "STRATAMETER_TOPIC_SCORES": topics["scores"],
           "STRATAMETER_TOPIC_LABEL_REQUESTS": topics["requests"],
           "STRATAMETER_TOPIC_LABELS": topics["labels"],
           "STRATAMETER_TOPIC_DEAD_LETTER": topics["dlq"],
           "STRATAMETER_HTTP_PORT": str(port),
           "STRATAMETER_HTTP_HOST": "127.0.0.1",
           "STRATAMETER_DELTA": "0.06",
           "STRATAMETER_CONFIDENCE": "0.99",
           "STRATAMETER_BATCH_MAX_RECORDS": "150",  # many small batches: the kill lands mid-stream
           "STRATAMETER_MAX_LABELS_PER_HOUR": "100000",
           "STRATAMETER_LOG_LEVEL": "WARNING"}
    service = ServiceProcess(env, port, str(tmp_path / "service.log"))

    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=False, linger_ms=20)
    await producer.start()
    truth: dict[str, int] = {}
    now_ms = int(time.time() * 1000)
    for cid in CLASSIFIERS:
        for i in range(PER_CLASSIFIER):
            score = 0.5 + 0.5 * ((i * 7919) % 1000) / 1000
            item = f"{cid}#{i}"
            truth[item] = int(((i * 104729) % 1000) / 1000 < score)
            await producer.send(topics["scores"], key=cid.encode(), value=orjson.dumps(
                {"classifier_id": cid, "item_id": item, "score": score, "event_time": now_ms}))
    bad = [b"{oops", b'{"classifier_id":"alpha","item_id":"x","score":NaN}', b'{"classifier_id":"alpha","score":1}']
    for value in bad:
        await producer.send(topics["scores"], key=b"alpha", value=value)
    await producer.flush()

    answered: dict[str, bool | None] = {}  # distinct request id -> label given
    requested_items: dict[str, str] = {}  # request id -> classifier/item
    reviewer = AIOKafkaConsumer(topics["requests"], bootstrap_servers=kafka_bootstrap, group_id=unique_name("rev"),
                                auto_offset_reset="earliest", session_timeout_ms=6000, heartbeat_interval_ms=500)
    await reviewer.start()
    leave_group_on_stop(reviewer)

    async def review() -> None:
        async for rec in reviewer:
            req = orjson.loads(rec.value)
            rid = req["request_id"]
            requested_items[rid] = f'{req["classifier_id"]}/{req["item_id"]}'
            label = answered.get(rid, None if len(answered) % 13 == 7 else bool(truth[req["item_id"]]))
            answered[rid] = label
            await producer.send(topics["labels"], value=orjson.dumps({"request_id": rid, "label": label}))

    review_task = asyncio.create_task(review())
    try:
        # 1) kill -9 mid-ingest
        service.start()
        total = len(CLASSIFIERS) * PER_CLASSIFIER
        await _wait(lambda: _partial(service, total), 60, "partial ingest")
        service.kill9()
        # 2) restart, kill -9 once labels are being folded
        service.start()
        await _wait(lambda: _labels_folded(port, 6), 90, "labels being folded")
        service.kill9()
        # 3) restart and let every classifier converge
        service.start()
        docs = await _wait(lambda: _all_converged(port), 120, "convergence after restarts")
        started = time.monotonic()
        assert service.terminate() == 0, "SIGTERM must close cleanly"
        assert time.monotonic() - started < 10, "SIGTERM must close within a few seconds"
    finally:
        review_task.cancel()
        await reviewer.stop()
        if service.proc and service.proc.poll() is None:
            service.kill9()

    dead = await _read_all(kafka_bootstrap, topics["dlq"], unique_name("dlq-reader"))
    await producer.stop()

    for cid, doc in docs.items():
        assert doc["scores"] == PER_CLASSIFIER, (cid, doc["scores"])  # invalid records are not scores
        assert doc["population"] == PER_CLASSIFIER
        folded = doc["labels_by_outcome"]["accepted"]
        mine = [rid for rid, label in answered.items() if rid.startswith(cid + "/") and label is not None]
        assert folded == len(mine), (cid, folded, len(mine))
        assert doc["labels"] == folded == sum(s["labels"] for s in doc["strata"])
        skipped = [rid for rid, label in answered.items() if rid.startswith(cid + "/") and label is None]
        assert doc["labels_by_outcome"]["skipped"] == len(skipped)
    # no item was ever requested under two different request ids
    assert len(set(requested_items.values())) == len(requested_items)
    # every bad record was dead-lettered with its original bytes and a reason (at-least-once: maybe repeated)
    originals = {base64.b64decode(d["original"]) for d in dead if d["topic"] == topics["scores"]}
    assert set(bad) <= originals
    assert all(d["reason"] and d["detail"] and isinstance(d["offset"], int) for d in dead)


async def _partial(service: ServiceProcess, total: int) -> bool:
    counted = sum((await service.scores()).values())
    return 0 < counted < total


async def _labels_folded(port: int, at_least: int) -> bool:
    n = 0
    for cid in CLASSIFIERS:
        status, doc = await _get(port, f"/v1/classifiers/{cid}")
        if status == 200:
            n += doc["labels_by_outcome"]["accepted"]
    return n >= at_least


async def _all_converged(port: int):
    docs = {}
    for cid in CLASSIFIERS:
        status, doc = await _get(port, f"/v1/classifiers/{cid}")
        if status != 200 or doc["status"] != "converged":
            return None
        docs[cid] = doc
    return docs


async def _read_all(bootstrap: str, topic: str, group: str) -> list[dict]:
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest",
                                session_timeout_ms=6000, heartbeat_interval_ms=500)
    await consumer.start()
    leave_group_on_stop(consumer)
    out: list[dict] = []
    try:
        idle = 0
        while idle < 3:
            batch = await consumer.getmany(timeout_ms=1000)
            records = [r for rs in batch.values() for r in rs]
            idle = 0 if records else idle + 1
            out += [orjson.loads(r.value) for r in records]
            if out and not records:
                break
    finally:
        await consumer.stop()
    return out
