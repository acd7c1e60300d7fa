"""Event time on the scores topic: epoch seconds vs milliseconds, the accepted window
(STRATAMETER_MAX_EVENT_TIME_SKEW_SECONDS ahead of the clock, ALLOWED_LATENESS_SECONDS after a
chunk's end), and the service dead-lettering what falls outside it."""

from __future__ import annotations

import time
from datetime import datetime

import orjson
import pytest

from stratameter.schemas import reference_rules
from stratameter.schemas.inbound import parse_scores
from stratameter.schemas.messages import (EPOCH_MS_FROM, DeadLetter, ScoreRecord, event_time_to_ms, event_time_window,
                                          format_time)
from stratameter.schemas.outbound import dead_letter_record
from tests.harness import read_topic, running_service, wait_for

HOUR_MS = 3_600_000
#: a wall clock 10 minutes into an hour-long chunk
CHUNK_START = 1_800_000_000_000 - 1_800_000_000_000 % HOUR_MS
NOW = CHUNK_START + 600_000
#: the defaults: 1-hour chunks, 300 s skew, 300 s lateness
WINDOW = event_time_window(NOW, 3600, 300, 300)


def enc(**fields) -> bytes:
    base = {"classifier_id": "fraud-v3", "item_id": "txn-1", "score": 0.7}
    base.update(fields)
    return orjson.dumps({k: v for k, v in base.items() if v is not ...})


def verdict(value: bytes, ts: int = NOW, window=WINDOW) -> int | tuple[str, str]:
    """The accepted event time (ms), or the reject's (reason, detail); the fast path and the
    reference rules must agree."""
    batch, rejects = parse_scores([value], [ts], 0.5, window=window)
    ref = reference_rules.score_row(orjson.loads(value), ts, lambda cid: 0.5, window)
    if rejects:
        assert len(batch) == 0 and ref == (rejects[0].reason, rejects[0].detail)
        return rejects[0].reason, rejects[0].detail
    assert len(batch) == 1 and ref[4] == int(batch.event_time_ms[0])
    return int(batch.event_time_ms[0])


def reason(value: bytes, ts: int = NOW, window=WINDOW) -> str | int:
    out = verdict(value, ts, window)
    return out[0] if isinstance(out, tuple) else out


# --------------------------------------------------------------------------- seconds or milliseconds


@pytest.mark.parametrize("value, ms", [
    (0, 0),
    (1, 1000),
    (1_800_000_000, 1_800_000_000_000),                  # seconds: 2027-01-15
    (1_800_000_000.25, 1_800_000_000_250),
    (EPOCH_MS_FROM - 1, (EPOCH_MS_FROM - 1) * 1000),     # the largest seconds: year 5138
    (EPOCH_MS_FROM - 0.5, (EPOCH_MS_FROM - 1) * 1000 + 500),
    (EPOCH_MS_FROM, EPOCH_MS_FROM),                      # the smallest milliseconds: 1973-03-03T09:46:40Z
    (float(EPOCH_MS_FROM), EPOCH_MS_FROM),
    (1_800_000_000_000, 1_800_000_000_000),
    (1_800_000_000_000.7, 1_800_000_000_000),
    (-1, None), (-0.001, None), (-10**12, None), (True, None), (253_402_300_800_000, None),
])
def test_a_number_below_1e11_is_seconds_else_milliseconds(value, ms):
    assert event_time_to_ms(value) == ms
    assert datetime.fromtimestamp(EPOCH_MS_FROM / 1000).year == 1973
    assert datetime.fromtimestamp(EPOCH_MS_FROM - 1).year == 5138


def test_seconds_and_milliseconds_of_the_same_instant_agree():
    sec = NOW // 1000
    assert reason(enc(event_time=sec)) == reason(enc(event_time=sec * 1000)) == sec * 1000
    assert reason(enc(event_time=sec + 0.5)) == sec * 1000 + 500
    assert ScoreRecord.model_validate_json(enc(event_time=sec)).event_time_ms(0) == sec * 1000


def test_negative_times_are_bad_event_time():
    for value in (-1, -1.5, -NOW, -(NOW // 1000)):
        got = verdict(enc(event_time=value), window=None)
        assert got[0] == "bad_event_time" and got[1].startswith("event_time: "), got
        assert "epoch seconds" in got[1]


def test_seconds_sent_as_milliseconds_is_never_a_1970_chunk():
    # 1_800_000_000 read as ms would be 1970-01-21; it is seconds (2027), and 0 (1970) is too late
    assert reason(enc(event_time=NOW // 1000)) == NOW // 1000 * 1000
    assert reason(enc(event_time=0)) == "event_time_too_late"
    assert reason(enc(event_time=EPOCH_MS_FROM)) == "event_time_too_late"           # 1973 in ms
    assert reason(enc(event_time="1970-01-21T12:00:00Z")) == "event_time_too_late"
    assert reason(enc(event_time="1969-12-31T23:59:59.999Z")) == "event_time_too_late"


# --------------------------------------------------------------------------- the window


def test_window_of_the_defaults():
    assert WINDOW == (CHUNK_START, NOW + 300_000)
    # 4 minutes into the hour the previous chunk is still open (it closes 5 minutes after its end)
    assert event_time_window(CHUNK_START + 240_000, 3600, 300, 300) == (CHUNK_START - HOUR_MS, CHUNK_START + 540_000)
    assert event_time_window(CHUNK_START + 300_000, 3600, 300, 300)[0] == CHUNK_START
    assert event_time_window(NOW, 3600, 0, 0) == (CHUNK_START, NOW)


@pytest.mark.parametrize("field", ["ms", "seconds", "rfc3339"])
def test_future_beyond_the_skew_is_rejected(field):
    def as_field(ms: int):
        return {"ms": ms, "seconds": ms / 1000, "rfc3339": format_time(ms)}[field]

    assert reason(enc(event_time=as_field(NOW))) == NOW
    assert reason(enc(event_time=as_field(NOW + 300_000))) == NOW + 300_000          # exactly the skew
    got = verdict(enc(event_time=as_field(NOW + 301_000)))
    assert got[0] == "event_time_in_future"
    assert got[1].startswith("event_time: ") and "MAX_EVENT_TIME_SKEW_SECONDS" in got[1]
    assert reason(enc(event_time=as_field(NOW + 300_000)), window=event_time_window(NOW, 3600, 299, 300)) \
        == "event_time_in_future"


def test_the_year_2999_is_in_the_future():
    assert reason(enc(event_time="2999-01-01T00:00:00Z")) == "event_time_in_future"
    assert reason(enc(event_time=32_472_144_000_000)) == "event_time_in_future"
    assert reason(enc(event_time=32_472_144_000)) == "event_time_in_future"       # the same, in seconds


def test_too_late_just_before_and_after_the_chunk_closes():
    previous = CHUNK_START - HOUR_MS
    closes = CHUNK_START + 300_000                                    # its end + ALLOWED_LATENESS_SECONDS
    before = event_time_window(closes - 1, 3600, 300, 300)
    after = event_time_window(closes, 3600, 300, 300)
    for et in (previous, CHUNK_START - 1):
        assert reason(enc(event_time=et), window=before) == et       # still open
        got = verdict(enc(event_time=et), window=after)              # closed
        assert got[0] == "event_time_too_late" and got[1].startswith("event_time: ")
        assert "ALLOWED_LATENESS_SECONDS" in got[1]
    assert reason(enc(event_time=previous - 1), window=before) == "event_time_too_late"
    assert reason(enc(event_time=CHUNK_START), window=after) == CHUNK_START
    # zero lateness: a chunk closes at its end
    assert reason(enc(event_time=CHUNK_START - 1), window=event_time_window(CHUNK_START, 3600, 300, 0)) \
        == "event_time_too_late"


def test_absent_event_time_falls_back_to_the_record_timestamp():
    for value in (enc(), enc(event_time=None), enc(context={"a": 1})):  # the short and the long fast path
        assert reason(value, ts=NOW) == NOW
        got = verdict(value, ts=NOW + 301_000)
        assert got[0] == "event_time_in_future"
        assert got[1].startswith("event_time: absent; the record timestamp ")
        assert reason(value, ts=CHUNK_START - 1) == "event_time_too_late"
        assert reason(value, ts=-1) == "event_time_too_late"                   # no timestamp at all
        assert reason(value, ts=2**62) == "event_time_in_future"               # beyond year 9999: still named
    # a valid event_time wins over the record timestamp, both ways
    assert reason(enc(event_time=NOW), ts=NOW + 10**9) == NOW
    assert reason(enc(event_time=NOW + 10**9), ts=NOW) == "event_time_in_future"


def test_format_errors_come_before_the_window():
    # a record outside the window is otherwise valid: another problem is reported first
    assert reason(enc(score="x", event_time="2999-01-01T00:00:00Z")) == "wrong_type:score"
    assert reason(enc(context=[1], event_time=0)) == "wrong_type:context"
    assert reason(enc(event_time="soon")) == "bad_event_time"


def test_a_mixed_batch_keeps_order_and_every_reject_is_a_dead_letter():
    values = [enc(item_id="0"), enc(item_id="1", event_time="2999-01-01T00:00:00Z"),
              enc(item_id="2", event_time=NOW // 1000), enc(item_id="3", event_time=0),
              enc(item_id="4", event_time=-5), enc(item_id="5", event_time=NOW - 1)]
    ts = [NOW, NOW, NOW, NOW, NOW, NOW + 10**9]
    batch, rejects = parse_scores(values, ts, 0.5, window=WINDOW)
    assert batch.item_id == ["0", "2", "5"] and batch.index.tolist() == [0, 2, 5]
    assert batch.event_time_ms.tolist() == [NOW, NOW // 1000 * 1000, NOW - 1]
    assert [(r.index, r.reason) for r in rejects] == [
        (1, "event_time_in_future"), (3, "event_time_too_late"), (4, "bad_event_time")]
    for r in rejects:
        doc = DeadLetter.model_validate_json(dead_letter_record(values[r.index], b"k", "stratameter.scores", 0,
                                                                r.index, r.reason, r.detail, NOW / 1000))
        assert doc.reason == r.reason and doc.detail.startswith("event_time: ")


def test_the_model_applies_the_window_from_its_context():
    from pydantic import ValidationError

    ctx = {"event_time_window": WINDOW, "timestamp_ms": NOW}
    assert ScoreRecord.model_validate_json(enc(event_time=NOW // 1000), context=ctx).event_time_ms(NOW) == NOW // 1000 * 1000
    for value, code in ((enc(event_time="2999-01-01T00:00:00Z"), "event_time_in_future"),
                        (enc(event_time=0), "event_time_too_late"),
                        (enc(), "event_time_in_future")):
        context = dict(ctx, timestamp_ms=NOW + 10**9) if value == enc() else ctx
        with pytest.raises(ValidationError) as info:
            ScoreRecord.model_validate_json(value, context=context)
        assert [(e["type"], e["loc"]) for e in info.value.errors()] == [(code, ("event_time",))]
    ScoreRecord.model_validate_json(enc(event_time=0))  # no window: any valid time


# --------------------------------------------------------------------------- the service


def _invalid_counts(metrics: str, topic: str) -> dict[str, int]:
    out = {}
    for line in metrics.splitlines():
        if line.startswith("stratameter_invalid_messages_total{") and f'topic="{topic}"' in line:
            reason = line.split('reason="', 1)[1].split('"', 1)[0]
            out[reason] = int(float(line.rsplit(" ", 1)[1]))
    return out


@pytest.mark.integration
async def test_service_dead_letters_future_and_late_records_and_reads_epoch_seconds(
        kafka_bootstrap, redis_url, unique_name):
    n = 40
    async with running_service(kafka_bootstrap, redis_url, unique_name) as run:  # 1-hour chunks, 300 s / 300 s
        now_ms = int(time.time() * 1000)
        for i in range(n):  # half in epoch ms, half in epoch seconds: one chunk, the current one
            et = now_ms if i % 2 else now_ms // 1000
            await run.send_score(classifier_id="evt", item_id=f"i{i}", score=0.5 + i / 100, event_time=et)
        await run.send_score(classifier_id="evt", item_id="y2999", score=0.9, event_time="2999-01-01T00:00:00Z")
        await run.send_score(classifier_id="evt", item_id="y2999s", score=0.9, event_time=32_472_144_000)
        await run.send_score(classifier_id="evt", item_id="late", score=0.9, event_time=now_ms - 2 * HOUR_MS)
        await run.send_score(classifier_id="evt", item_id="neg", score=0.9, event_time=-5)
        # no event_time: the record timestamp is the event time, with the same checks
        await run.producer.send(run.topics["scores"], key=b"evt", timestamp_ms=now_ms + 3 * HOUR_MS,
                                value=orjson.dumps({"classifier_id": "evt", "item_id": "ts-future", "score": 0.9}))
        await run.producer.flush()
        expected = {"event_time_in_future": 3, "event_time_too_late": 1, "bad_event_time": 1}

        async def counted():
            status, body = await run.get("/metrics")
            counts = _invalid_counts(body.decode(), run.topics["scores"]) if status == 200 else {}
            status, body = await run.get("/v1/classifiers/evt")
            doc = orjson.loads(body) if status == 200 else None
            seen[:] = [counts, doc and doc["scores"]]
            return (counts, doc) if counts == expected and doc and doc["scores"] == n else None

        seen: list = []
        try:
            counts, doc = await wait_for(counted, 90, "the valid records counted and the others dead-lettered")
        except AssertionError:
            raise AssertionError(f"last seen: {seen}") from None
        # only the current chunk exists: no chunk in 2999, none two hours ago, none in 1970
        start = datetime.fromisoformat(doc["chunk"]["start"]).timestamp() * 1000
        assert start == now_ms // HOUR_MS * HOUR_MS
        assert doc["history"] == [] and doc["population"] == n
        assert sum(s["items"] for s in doc["strata"]) == n

    dead = await read_topic(kafka_bootstrap, run.topics["dlq"], unique_name("dlq"), expect=5)
    by_item = {orjson.loads(__import__("base64").b64decode(d["original"]))["item_id"]: d for d in dead}
    assert {k: d["reason"] for k, d in by_item.items()} == {
        "y2999": "event_time_in_future", "y2999s": "event_time_in_future", "ts-future": "event_time_in_future",
        "late": "event_time_too_late", "neg": "bad_event_time"}
    assert all(d["detail"].startswith("event_time: ") for d in dead)
    assert by_item["ts-future"]["detail"].startswith("event_time: absent; the record timestamp ")
