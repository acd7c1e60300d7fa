"""Fuzz through the running service: 10,000 malformed score and label records
(seeded generator) mixed with valid ones.  The service never stops, every bad
record is counted and dead-lettered with a reason, every valid score counted."""

from __future__ import annotations

import asyncio
import random
import time

import orjson
import pytest

from tests.harness import read_topic, running_service, wait_for

pytestmark = pytest.mark.integration

BAD_SCORES = 7000
BAD_LABELS = 3000
VALID = 3000


def bad_score(rng: random.Random, i: int) -> bytes | None:
    """A score record that is invalid by construction (one mutation of a valid one)."""
    base = {"classifier_id": "fz", "item_id": f"bad{i}", "score": 0.7}
    kind = rng.randrange(14)
    if kind == 0:
        return None  # tombstone
    if kind == 1:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 60))) + b"\xff{"  # not JSON/UTF-8
    if kind == 2:
        return orjson.dumps([base])  # not an object
    if kind == 3:
        del base[rng.choice(["classifier_id", "item_id", "score"])]
    elif kind == 4:
        base["score"] = rng.choice(["0.7", True, None, [0.7], {"v": 1}])
    elif kind == 5:
        return orjson.dumps(base).replace(b"0.7", rng.choice([b"NaN", b"Infinity", b"-Infinity", b"1e999"]))
    elif kind == 6:
        base["classifier_id"] = rng.choice(["", "x" * 129, "bad id", "a/b", "é", 7])
    elif kind == 7:
        base["item_id"] = rng.choice(["", "i" * 513, 5, None])
    elif kind == 8:
        base["predicted_positive"] = rng.choice(["true", 1, 0, "yes"])
    elif kind == 9:
        base["event_time"] = rng.choice(["yesterday", "2026-13-01T00:00:00Z", "2026-01-01T00:00:00", True, -5,
                                         "2999-01-01T00:00:00Z", 0])  # negative, in the future, 1970: too late
    elif kind == 10:
        base["context"] = rng.choice([[1, 2], "ctx", 5, {"blob": "x" * 9000}])
    elif kind == 11:
        return b'{"classifier_id":"fz","item_id":"big","score":0.5,"pad":"' + b"x" * 70_000 + b'"}'
    elif kind == 12:
        return orjson.dumps(base)[: rng.randrange(1, 30)]  # truncated
    else:
        return b""
    return orjson.dumps(base)


def bad_label(rng: random.Random, i: int) -> bytes | None:
    kind = rng.randrange(7)
    if kind == 0:
        return None
    if kind == 1:
        return b"\x00\x01label"
    if kind == 2:
        return orjson.dumps({"label": True})  # no request_id
    if kind == 3:
        return orjson.dumps({"request_id": f"fz/{i}"})  # no label
    if kind == 4:
        return orjson.dumps({"request_id": rng.choice([5, None, ["x"], ""]), "label": True})
    if kind == 5:
        return orjson.dumps({"request_id": f"fz/{i}", "label": rng.choice(["true", 1, 0, "no"])})
    return orjson.dumps(["not", "an", "object"])


async def test_fuzzed_inputs_never_stop_the_service(kafka_bootstrap, redis_url, unique_name):
    rng = random.Random(20261122)
    async with running_service(kafka_bootstrap, redis_url, unique_name, DEAD_LETTER_MAX_PER_SECOND="1000000",
                               STRATA="2") as run:
        now = int(time.time() * 1000)
        kinds = ["bad"] * BAD_SCORES + ["good"] * VALID
        rng.shuffle(kinds)
        for i, kind in enumerate(kinds):
            value = bad_score(rng, i) if kind == "bad" else orjson.dumps(
                {"classifier_id": "fz", "item_id": f"ok{i}", "score": rng.random(), "event_time": now})
            await run.producer.send(run.topics["scores"], key=b"fz", value=value)
        for i in range(BAD_LABELS):
            await run.producer.send(run.topics["labels"], key=b"k", value=bad_label(rng, i))
        await run.producer.flush()

        async def all_counted():
            status, body = await run.get("/metrics")
            if status != 200:
                return None
            text = body.decode()
            invalid = {"scores": 0, "labels": 0}
            for line in text.splitlines():
                if line.startswith("stratameter_invalid_messages_total{"):
                    topic = "scores" if run.topics["scores"] in line else "labels"
                    invalid[topic] += int(float(line.rsplit(" ", 1)[1]))
            status, body = await run.get("/v1/classifiers/fz")
            scores = orjson.loads(body)["scores"] if status == 200 else 0
            return (invalid, scores) if invalid == {"scores": BAD_SCORES, "labels": BAD_LABELS} and scores == VALID else None

        await wait_for(all_counted, 120, "every record accounted for")
        assert (await run.get("/healthz"))[0] == 200
        assert all(not t.done() for t in asyncio.all_tasks() if "forever" in repr(t.get_coro()))

    dead = await read_topic(kafka_bootstrap, run.topics["dlq"], unique_name("dlq"), expect=BAD_SCORES + BAD_LABELS,
                            max_partition_fetch_bytes=4 << 20)
    by_source = {(d["topic"], d["partition"], d["offset"]): d for d in dead}
    assert len(by_source) == BAD_SCORES + BAD_LABELS
    assert all(d["reason"] and d["detail"] for d in by_source.values())
    assert all(len(orjson.dumps(d)) < 100_000 for d in dead)  # bounded, even for the 70 KB records
