"""The benchmark's input: score records as classifiers send them, and producing them to the
scores topic (step 1 of `core`; `ingest_cpu` decodes the same records without Kafka)."""

from __future__ import annotations

import asyncio
import time

import numpy as np

from stratameter.schemas.outbound import score_record_bytes

CHUNK_MS = 3_600_000  # the service's default chunk (STRATAMETER_CHUNK_SECONDS=3600)


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
