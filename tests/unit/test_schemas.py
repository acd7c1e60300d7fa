"""The wire contract: message models, batch parsers, outbound serializers."""

from __future__ import annotations

import base64
import math
from datetime import datetime, timedelta, timezone

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from stratameter.schemas import inbound, reference_rules
from stratameter.schemas.batches import LabelBatch, Reject, ScoreBatch
from stratameter.schemas.inbound import parse_labels, parse_scores
from stratameter.schemas.messages import (
    MAX_CONTEXT_BYTES,
    MAX_DEAD_LETTER_DETAIL_BYTES,
    MAX_DEAD_LETTER_KEY_BYTES,
    MAX_DEAD_LETTER_ORIGINAL_BYTES,
    MAX_RECORD_BYTES,
    MESSAGES,
    REJECT_REASONS,
    TOPIC_DEAD_LETTER,
    TOPIC_LABEL_REQUESTS,
    TOPIC_LABELS,
    TOPIC_SCORES,
    DeadLetter,
    LabelRecord,
    LabelRequest,
    ScoreRecord,
    format_time,
    rfc3339_to_ms,
    time_to_ms,
)
from stratameter.schemas.times import _rfc3339_to_ms_by_parts
from stratameter.schemas.outbound import (
    dead_letter_record,
    decode_label_request,
    label_record_bytes,
    label_request_bytes,
    score_record_bytes,
)

TS = 1_718_000_000_000  # a Kafka record timestamp (2024-06-10T06:13:20Z)


def rec(**fields) -> dict:
    base = {"classifier_id": "fraud-v3", "item_id": "txn-1", "score": 0.7}
    base.update(fields)
    return {k: v for k, v in base.items() if v is not ...}


def enc(**fields) -> bytes:
    return orjson.dumps(rec(**fields))


def one(value, threshold=0.5) -> tuple[ScoreBatch, list[Reject]]:
    return parse_scores([value], [TS], threshold)


def reason(value) -> str:
    batch, rejects = one(value)
    assert len(batch) == 0, f"accepted: {value!r}"
    assert len(rejects) == 1 and rejects[0].index == 0
    return rejects[0].reason


def accepted(value, threshold=0.5) -> dict:
    batch, rejects = one(value, threshold)
    assert rejects == [], rejects
    assert len(batch) == 1 and batch.index.tolist() == [0]
    return {"classifier_id": batch.classifier_id[0], "item_id": batch.item_id[0], "score": batch.score[0],
            "predicted_positive": bool(batch.predicted_positive[0]), "event_time_ms": int(batch.event_time_ms[0]),
            "context": batch.context[0]}


# --------------------------------------------------------------------------- contract basics


def test_topics_and_models():
    assert (TOPIC_SCORES, TOPIC_LABEL_REQUESTS, TOPIC_LABELS, TOPIC_DEAD_LETTER) == (
        "stratameter.scores", "stratameter.label-requests", "stratameter.labels", "stratameter.dead-letter")
    assert MESSAGES == {TOPIC_SCORES: ScoreRecord, TOPIC_LABEL_REQUESTS: LabelRequest,
                        TOPIC_LABELS: LabelRecord, TOPIC_DEAD_LETTER: DeadLetter}
    for model in MESSAGES.values():
        schema = model.model_json_schema()
        assert schema["type"] == "object" and schema["properties"]
    assert set(ScoreRecord.model_json_schema()["required"]) == {"classifier_id", "item_id", "score"}
    assert set(LabelRecord.model_json_schema()["required"]) == {"request_id", "label"}


# --------------------------------------------------------------------------- score rejections

BIG_CONTEXT = {"blob": "x" * MAX_CONTEXT_BYTES}


@pytest.mark.parametrize("value, code", [
    # score
    (enc(score="0.9"), "wrong_type:score"),
    (enc(score=True), "wrong_type:score"),
    (enc(score=False), "wrong_type:score"),
    (enc(score=None), "wrong_type:score"),
    (enc(score=[0.5]), "wrong_type:score"),
    (enc(score={"v": 0.5}), "wrong_type:score"),
    (b'{"classifier_id":"a","item_id":"b","score":NaN}', "not_finite:score"),
    (b'{"classifier_id":"a","item_id":"b","score":Infinity}', "not_finite:score"),
    (b'{"classifier_id":"a","item_id":"b","score":-Infinity}', "not_finite:score"),
    (b'{"classifier_id":"a","item_id":"b","score":1e999}', "not_finite:score"),
    (b'{"classifier_id":"a","item_id":"b","score":-1e999}', "not_finite:score"),
    (b'{"classifier_id":"a","item_id":"b","score":' + b"9" * 400 + b"}", "not_finite:score"),
    # missing fields
    (enc(score=...), "missing_field:score"),
    (enc(classifier_id=...), "missing_field:classifier_id"),
    (enc(item_id=...), "missing_field:item_id"),
    (b"{}", "missing_field:classifier_id"),
    # classifier_id
    (enc(classifier_id="fraud v3"), "bad_classifier_id"),
    (enc(classifier_id="fraud/v3"), "bad_classifier_id"),
    (enc(classifier_id="fraüd"), "bad_classifier_id"),
    (enc(classifier_id="fraud\n"), "bad_classifier_id"),
    (enc(classifier_id="٣"), "bad_classifier_id"),  # a non-ASCII digit
    (enc(classifier_id=""), "bad_classifier_id"),
    (enc(classifier_id="a" * 129), "bad_classifier_id"),
    (enc(classifier_id=None), "wrong_type:classifier_id"),
    (enc(classifier_id=3), "wrong_type:classifier_id"),
    # item_id
    (enc(item_id="x" * 513), "bad_item_id"),
    (enc(item_id=""), "bad_item_id"),
    (enc(item_id=17), "wrong_type:item_id"),
    (enc(item_id=None), "wrong_type:item_id"),
    # predicted_positive
    (enc(predicted_positive="true"), "wrong_type:predicted_positive"),
    (enc(predicted_positive=1), "wrong_type:predicted_positive"),
    (enc(predicted_positive=0), "wrong_type:predicted_positive"),
    # context
    (enc(context=BIG_CONTEXT), "context_too_large"),
    (enc(context=[1, 2]), "wrong_type:context"),
    (enc(context="k=v"), "wrong_type:context"),
    (enc(context=3), "wrong_type:context"),
    (b'{"classifier_id":"a","item_id":"b","score":1,"context":' + b'{"a":' * 300 + b"1" + b"}" * 301,
     "context_too_large"),
    # event_time
    (enc(event_time="yesterday"), "bad_event_time"),
    (enc(event_time="2024-06-10T08:13:20"), "bad_event_time"),      # naive
    (enc(event_time="2024-06-10 08:13:20"), "bad_event_time"),      # naive
    (enc(event_time="2024-06-10"), "bad_event_time"),
    (enc(event_time="2024-06-10T08:13Z"), "bad_event_time"),        # no seconds
    (enc(event_time="20240610T081320Z"), "bad_event_time"),         # ISO 8601 basic, not RFC 3339
    (enc(event_time="2024-02-30T08:13:20Z"), "bad_event_time"),
    (enc(event_time="2024-06-10T24:00:00Z"), "bad_event_time"),
    (enc(event_time="2024-06-10T08:13:20+01:60"), "bad_event_time"),
    (enc(event_time="2024-06-10T08:13:20+24:00"), "bad_event_time"),
    (enc(event_time="2024-06-10T08:13:20+0100"), "bad_event_time"),
    (enc(event_time=True), "bad_event_time"),
    (enc(event_time=[TS]), "bad_event_time"),
    (enc(event_time=1e20), "bad_event_time"),
    (enc(event_time=-10**15), "bad_event_time"),
    (enc(event_time=-1), "bad_event_time"),                         # negative: neither seconds nor ms
    (enc(event_time=-0.5), "bad_event_time"),
    (enc(event_time=253_402_300_800_000), "bad_event_time"),        # after year 9999
    (b'{"classifier_id":"a","item_id":"b","score":1,"event_time":NaN}', "bad_event_time"),
    (b'{"classifier_id":"a","item_id":"b","score":1,"event_time":1e999}', "bad_event_time"),
    # the value itself
    (None, "tombstone"),
    (b"", "tombstone"),
    (b"{not json", "invalid_json"),
    (b'{"classifier_id":"a","item_id":"b","score":0.5', "invalid_json"),
    (b'{"classifier_id":"a","item_id":"b","score":0.5} x', "invalid_json"),
    (b'{"classifier_id":"a","item_id":"\xff","score":0.5}', "invalid_json"),
    (b'{"classifier_id":"a","item_id":"\\ud800","score":0.5}', "invalid_json"),  # lone surrogate
    (b'{"classifier_id":"a","item_id":"b","score":0.5,"x":NaN}', "invalid_json"),
    (b'{"classifier_id":"a","item_id":"b","score":0.5,"context":{"x":1e999}}', "invalid_json"),
    (b"[1, 2]", "not_object"),
    (b'"fraud-v3"', "not_object"),
    (b"null", "not_object"),
    (b"0.5", "not_object"),
])
def test_score_rejections(value, code):
    assert reason(value) == code
    base = code.split(":")[0]
    assert code in REJECT_REASONS or f"{base}:<field>" in REJECT_REASONS


def test_too_large_is_not_parsed():
    big = b'{"classifier_id":"a","item_id":"b","score":1,"pad":"' + b"x" * 70_000 + b'"}'
    assert reason(big) == "too_large"
    assert reason(b"{" * 70_000) == "too_large"  # not even looked at
    batch, rejects = parse_scores([enc()], [TS], 0.5, max_bytes=10)
    assert rejects[0].reason == "too_large"
    batch, rejects = parse_scores([big], [TS], 0.5, max_bytes=100_000)
    assert len(batch) == 1


def test_detail_names_the_field():
    cases = {enc(score="0.9"): "score", enc(classifier_id="a b"): "classifier_id", enc(item_id=""): "item_id",
             enc(event_time="x"): "event_time", enc(context=[1]): "context",
             enc(predicted_positive="yes"): "predicted_positive", enc(context=BIG_CONTEXT): "context"}
    _, rejects = parse_scores(list(cases), [TS] * len(cases), 0.5)
    for r, field in zip(rejects, cases.values()):
        assert r.detail.startswith(field + ":"), r
        assert len(r.detail) < 400


def test_context_limit_is_on_compact_size():
    pad = MAX_CONTEXT_BYTES - len(b'{"k":""}')
    exact = {"k": "x" * pad}
    assert len(orjson.dumps(exact)) == MAX_CONTEXT_BYTES
    assert accepted(enc(context=exact))["context"] == orjson.dumps(exact).decode()
    assert reason(enc(context={"k": "x" * (pad + 1)})) == "context_too_large"
    # whitespace in the original does not count: the context is re-serialized compactly
    spaced = b'{"classifier_id":"a","item_id":"b","score":1,"context":{ "k" :  "' + b"x" * pad + b'" } }'
    assert accepted(spaced)["context"] == orjson.dumps(exact).decode()


# --------------------------------------------------------------------------- score acceptance


def test_minimal_record_defaults():
    got = accepted(enc())
    assert got == {"classifier_id": "fraud-v3", "item_id": "txn-1", "score": 0.7, "predicted_positive": True,
                   "event_time_ms": TS, "context": None}
    assert accepted(enc(score=0.2))["predicted_positive"] is False
    assert accepted(enc(score=0.5))["predicted_positive"] is True  # score >= threshold


def test_explicit_nulls_mean_absent():
    got = accepted(enc(score=0.7, predicted_positive=None, event_time=None, context=None))
    assert got["predicted_positive"] is True and got["event_time_ms"] == TS and got["context"] is None


@pytest.mark.parametrize("score", [0, 1, -3, 10**18, 2**64 - 1, -1e300, 1e300, 5e-324, -0.0, 12.5])
def test_any_finite_number_is_a_score(score):
    assert accepted(enc(score=score))["score"] == float(score)


def test_predicted_positive_wins_both_ways():
    assert accepted(enc(score=0.99, predicted_positive=False))["predicted_positive"] is False
    assert accepted(enc(score=0.01, predicted_positive=True))["predicted_positive"] is True
    assert accepted(enc(score=0.99, predicted_positive=True))["predicted_positive"] is True
    assert accepted(enc(score=0.01, predicted_positive=False))["predicted_positive"] is False


def test_threshold_per_classifier():
    values = [enc(classifier_id="a", score=0.6), enc(classifier_id="b", score=0.6),
              enc(classifier_id="c", score=0.6), enc(classifier_id="a", score=0.8)]
    ts = [TS] * 4
    batch, _ = parse_scores(values, ts, {"a": 0.7, "b": 0.6})     # "c" -> DEFAULT_THRESHOLD 0.5
    assert batch.predicted_positive.tolist() == [False, True, True, True]
    calls = []

    def thr(cid: str) -> float:
        calls.append(cid)
        return {"a": 0.7, "b": 0.61, "c": -5.0}[cid]
    batch, _ = parse_scores(values, ts, thr)
    assert batch.predicted_positive.tolist() == [False, False, True, True]
    assert sorted(calls) == ["a", "b", "c"]  # once per classifier per batch
    batch, _ = parse_scores(values, ts, 0.65)
    assert batch.predicted_positive.tolist() == [False, False, False, True]
    batch, _ = parse_scores([enc(score=-2.0)], [TS], {"fraud-v3": -3})  # logits: any range
    assert batch.predicted_positive.tolist() == [True]
    with pytest.raises(TypeError):
        parse_scores(values, ts, "0.5")  # type: ignore[arg-type]


@pytest.mark.parametrize("event_time, ms", [
    (1_718_007_200_000, 1_718_007_200_000),                       # epoch ms int
    (1_718_007_200_000.9, 1_718_007_200_000),                     # epoch ms float, floored
    (1_718_007_200, 1_718_007_200_000),                           # below 1e11: epoch seconds
    (1_718_007_200.5, 1_718_007_200_500),
    (1_718_007_200.123, 1_718_007_200_123),                       # not ...122 (binary error of x * 1000)
    (99_999_999_999, 99_999_999_999_000),                         # the largest seconds: year 5138
    (100_000_000_000, 100_000_000_000),                           # the smallest ms: 1973-03-03
    (0, 0),                                                       # 0 s = 0 ms (a window rejects it)
    (253_402_300_799_999, 253_402_300_799_999),
    ("2024-06-10T08:13:20Z", 1_718_007_200_000),
    ("2024-06-10T08:13:20.5Z", 1_718_007_200_500),
    ("2024-06-10T08:13:20.123456789Z", 1_718_007_200_123),
    ("2024-06-10t08:13:20z", 1_718_007_200_000),
    ("2024-06-10 08:13:20Z", 1_718_007_200_000),
    ("2024-06-10T10:13:20+02:00", 1_718_007_200_000),
    ("2024-06-10T03:13:20-05:00", 1_718_007_200_000),
    ("2024-06-10T08:13:20-00:00", 1_718_007_200_000),
    ("2016-12-31T23:59:60Z", 1_483_228_800_000),                  # leap second
    ("1969-12-31T23:59:59.999Z", -1),
    ("0001-01-01T00:00:00Z", -62_135_596_800_000),
    ("9999-12-31T23:59:59.999Z", 253_402_300_799_999),
])
def test_event_time_forms(event_time, ms):
    assert accepted(enc(event_time=event_time))["event_time_ms"] == ms


def test_unknown_fields_are_ignored():
    got = accepted(enc(model_version="7", extra={"a": [1, 2]}, context={"country": "DE", "amount": 12.5}))
    assert got["context"] == '{"country":"DE","amount":12.5}'


def test_mixed_batch_partitions_in_order():
    values = [enc(item_id="0"), None, b"{x", enc(item_id="3", score="1"), enc(item_id="4", score=0.1),
              enc(item_id="5", context={"a": 1}, event_time="2024-06-10T08:13:20Z"), b"", enc(classifier_id="a b")]
    ts = [TS + i for i in range(len(values))]
    batch, rejects = parse_scores(values, ts, 0.5)
    assert batch.index.tolist() == [0, 4, 5]
    assert batch.item_id == ["0", "4", "5"]
    assert batch.event_time_ms.tolist() == [TS, TS + 4, 1_718_007_200_000]
    assert batch.context == [None, None, '{"a":1}']
    assert [(r.index, r.reason) for r in rejects] == [
        (1, "tombstone"), (2, "invalid_json"), (3, "wrong_type:score"), (6, "tombstone"), (7, "bad_classifier_id")]
    assert batch.index.dtype == np.int64 and batch.score.dtype == np.float64
    assert batch.predicted_positive.dtype == np.bool_ and batch.event_time_ms.dtype == np.int64


def test_empty_batches():
    batch, rejects = parse_scores([], [], 0.5)
    assert len(batch) == 0 and rejects == [] and batch.index.dtype == np.int64
    assert batch.score.dtype == np.float64 and batch.predicted_positive.dtype == np.bool_
    batch, rejects = parse_scores([None, None], [TS, TS], 0.5)
    assert len(batch) == 0 and batch.index.size == 0 and [r.index for r in rejects] == [0, 1]
    lb, rejects = parse_labels([], [])
    assert len(lb) == 0 and lb.labeled_at_ms.dtype == np.int64
    with pytest.raises(ValueError):
        parse_scores([enc()], [], 0.5)
    with pytest.raises(ValueError):
        parse_labels([b"{}"], [TS, TS])


@pytest.mark.parametrize("values", [
    [enc(), enc() + enc()],  # two objects in one value: it would read as two records if joined
    [enc() + b" " + enc(), enc(item_id="x")],
    [enc()[:-1] + b',"context":{"k":"}', b'{"}}', enc()],  # a string across the seam: a raw newline
    [enc(context={"k": "v"})[:-2] + b"}", b'{"k":1}}'],  # an object across the seam
    [b"{}", enc(), b"{ }", enc(item_id="y")],
    [enc(), b'{"classifier_id":"a","item_id":"\xff","score":0.5}', enc()],
    [enc()] * 300 + [enc(classifier_id="a b")] + [enc()] * 300,  # more than one chunk
])
def test_a_batch_reads_each_value_alone(values):
    """A value that is not exactly one object never pairs up with its neighbour, in or
    across the batch (as it could if values were ever decoded joined)."""
    batch, rejects = parse_scores(values, [TS] * len(values), 0.5)
    _check_partition(len(values), batch, rejects)
    by_index = {r.index: r for r in rejects}
    for i, value in enumerate(values):
        alone, alone_rejects = parse_scores([value], [TS], 0.5)
        if alone_rejects:
            assert by_index[i][1:] == alone_rejects[0][1:], value
        else:
            j = batch.index.tolist().index(i)
            assert (batch.item_id[j], batch.context[j]) == (alone.item_id[0], alone.context[0])


def test_merge_of_rows_accepted_only_by_the_reference_check():
    # No valid record is expected to miss the fast path; if one ever does, it is merged in order.
    index = np.array([0, 3], dtype=np.int64)
    flat = ["a", 1, "b", 2]
    merged, rows = inbound._merge_late(index, flat, [(1, "x", 9), (5, "y", 8)], 2)
    assert merged.tolist() == [0, 1, 3, 5] and rows == ["a", 1, "x", 9, "b", 2, "y", 8]


# --------------------------------------------------------------------------- labels


def lab(**fields) -> bytes:
    base = {"request_id": "fraud-v3/abc", "label": True}
    base.update(fields)
    return orjson.dumps({k: v for k, v in base.items() if v is not ...})


@pytest.mark.parametrize("value, code", [
    (lab(label=...), "missing_field:label"),
    (lab(label="true"), "wrong_type:label"),
    (lab(label=1), "wrong_type:label"),
    (lab(label=0), "wrong_type:label"),
    (lab(request_id=...), "missing_field:request_id"),
    (lab(request_id=None), "wrong_type:request_id"),
    (lab(request_id=5), "wrong_type:request_id"),
    (lab(request_id=""), "bad_request_id"),
    (lab(request_id="r" * 257), "bad_request_id"),
    (lab(labeler_id=7), "wrong_type:labeler_id"),
    (lab(labeler_id="w" * 257), "bad_labeler_id"),
    (lab(labeled_at="2024-06-10T08:13:20"), "bad_labeled_at"),
    (lab(labeled_at="soon"), "bad_labeled_at"),
    (lab(labeled_at=False), "bad_labeled_at"),
    (b'{"request_id":"r","label":true,"labeled_at":Infinity}', "bad_labeled_at"),
    (None, "tombstone"),
    (b"", "tombstone"),
    (b"{", "invalid_json"),
    (b"[true]", "not_object"),
    (b'{"request_id":"r","label":true,"pad":"' + b"x" * 70_000 + b'"}', "too_large"),
])
def test_label_rejections(value, code):
    batch, rejects = parse_labels([value], [TS])
    assert len(batch) == 0 and [(r.index, r.reason) for r in rejects] == [(0, code)]
    if ":" in code:
        assert rejects[0].detail.startswith(code.split(":")[1] + ":")


def test_label_acceptance():
    values = [lab(), lab(label=False, labeler_id="alice"), lab(label=None, labeled_at="2024-06-10T08:13:20Z"),
              lab(label=True, labeler_id=None, labeled_at=1_718_007_200_123, note="x"), b"{}",
              lab(labeler_id="", request_id="r" * 256)]
    batch, rejects = parse_labels(values, [TS + i for i in range(len(values))])
    assert isinstance(batch, LabelBatch)
    assert batch.index.tolist() == [0, 1, 2, 3, 5]
    assert batch.label == [True, False, None, True, True]
    assert batch.labeler_id == [None, "alice", None, None, ""]
    assert batch.labeled_at_ms.tolist() == [TS, TS + 1, 1_718_007_200_000, 1_718_007_200_123, TS + 5]
    assert batch.request_id[-1] == "r" * 256
    assert [(r.index, r.reason) for r in rejects] == [(4, "missing_field:request_id")]


# --------------------------------------------------------------------------- parser == models

_int64 = st.integers(-2**63, 2**63 - 1)
_numbers = st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.integers(-2**63, 2**64 - 1))
_times = st.one_of(
    st.integers(-2**62, 2**62), st.floats(allow_nan=False, allow_infinity=False),
    st.datetimes(timezones=st.timezones()).map(lambda d: d.isoformat()),
    st.datetimes().map(lambda d: d.isoformat()),
    st.sampled_from(["2024-06-10T08:13:20Z", "2024-06-10t08:13:20.1z", "2016-12-31T23:59:60Z", "soon",
                     "2024-06-10T08:13:20+01:60"]),
    st.booleans(), st.none(),
    # near TS, in ms and in seconds, and around the seconds/ms boundary: where the window cuts
    st.integers(TS - 10**8, TS + 10**8), st.integers(TS // 1000 - 10**5, TS // 1000 + 10**5),
    st.floats(TS / 1000 - 10**5, TS / 1000 + 10**5), st.integers(10**11 - 3, 10**11 + 3))
#: event-time windows (min_ms, max_ms) around TS, or none
_windows = st.one_of(st.none(), st.tuples(st.integers(TS - 10**8, TS), st.integers(TS, TS + 10**8)),
                     st.tuples(st.integers(TS - 2 * 10**8, TS - 10**8), st.integers(TS - 10**8, TS)),
                     st.sampled_from([(TS, TS), (TS + 1, TS + 10**8), (TS - 10**8, TS - 1), (0, 2**62)]))
_json_leaf = st.one_of(st.none(), st.booleans(), _numbers, st.text(max_size=20))
_json = st.recursive(_json_leaf, lambda c: st.one_of(st.lists(c, max_size=4),
                                                     st.dictionaries(st.text(max_size=8), c, max_size=4)),
                     max_leaves=20)
_absent = st.just(...)
_contexts = st.dictionaries(st.text(max_size=8), _json, max_size=4)

# each field: a valid value 80% of the time, else anything (often invalid)
_FIELDS = {
    "classifier_id": (st.from_regex(r"[A-Za-z0-9._:-]{1,128}", fullmatch=True),
                      st.one_of(st.text(max_size=130), st.sampled_from(["", "a b", "x" * 129, "é", "x" * 128]),
                                _int64, st.none(), _absent)),
    "item_id": (st.text(min_size=1, max_size=20),
                st.one_of(st.text(min_size=510, max_size=515), st.just(""), _int64, st.none(), _absent)),
    "score": (_numbers, st.one_of(st.booleans(), st.text(max_size=3), st.none(), _absent)),
    "predicted_positive": (st.one_of(st.booleans(), st.none(), _absent),
                           st.one_of(st.integers(0, 1), st.text(max_size=4))),
    "event_time": (st.one_of(_times, _absent), _times),
    "context": (st.one_of(_contexts, st.none(), _absent),
                st.one_of(_json, st.just({"k": "x" * (MAX_CONTEXT_BYTES - 7)}),
                          st.just({"k": "x" * (MAX_CONTEXT_BYTES - 8)}))),
}


@st.composite
def score_records(draw) -> dict:
    fields = {name: draw(valid if draw(st.integers(0, 9)) < 8 else anything)
              for name, (valid, anything) in _FIELDS.items()}
    return rec(**fields)


@pytest.mark.slow
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(score_records(), st.floats(-10, 10), _windows)
def test_parse_scores_agrees_with_the_model(record, threshold, window):
    raw = orjson.dumps(record)
    batch, rejects = parse_scores([raw], [TS], threshold, window=window)
    try:
        model = ScoreRecord.model_validate_json(raw, context={"event_time_window": window, "timestamp_ms": TS})
    except ValidationError as exc:
        assert len(batch) == 0, (record, exc)
        field = rejects[0].reason.partition(":")[2] or {
            "bad_classifier_id": "classifier_id", "bad_item_id": "item_id", "bad_event_time": "event_time",
            "event_time_in_future": "event_time", "event_time_too_late": "event_time",
            "context_too_large": "context"}[rejects[0].reason]
        assert field in {str(e["loc"][0]) for e in exc.errors()}
        if rejects[0].reason.startswith("event_time_"):  # the window is checked last: nothing else is wrong
            assert [e["type"] for e in exc.errors()] == [rejects[0].reason]
        return
    assert rejects == [], (record, rejects)
    assert batch.classifier_id == [model.classifier_id] and batch.item_id == [model.item_id]
    assert batch.score[0] == model.score
    assert bool(batch.predicted_positive[0]) == model.is_positive(threshold)
    assert int(batch.event_time_ms[0]) == model.event_time_ms(TS)
    assert batch.context == [None if model.context is None else orjson.dumps(model.context).decode()]


@st.composite
def label_records(draw) -> dict:
    out = {"request_id": draw(st.one_of(st.text(max_size=5), st.text(min_size=255, max_size=258), _int64,
                                        st.none(), _absent)),
           "label": draw(st.one_of(st.booleans(), st.none(), st.integers(0, 1), st.text(max_size=4), _absent)),
           "labeler_id": draw(st.one_of(st.text(max_size=5), st.text(min_size=255, max_size=258), _int64,
                                        st.none(), _absent)),
           "labeled_at": draw(st.one_of(_times, _absent))}
    return {k: v for k, v in out.items() if v is not ...}


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(label_records())
def test_parse_labels_agrees_with_the_model(record):
    raw = orjson.dumps(record)
    batch, rejects = parse_labels([raw], [TS])
    try:
        model = LabelRecord.model_validate_json(raw)
    except ValidationError:
        assert len(batch) == 0 and len(rejects) == 1
        return
    assert rejects == []
    assert batch.request_id == [model.request_id] and batch.label == [model.label]
    assert batch.labeler_id == [model.labeler_id]
    expected = TS if model.labeled_at is None else time_to_ms(model.labeled_at)
    assert batch.labeled_at_ms.tolist() == [expected]


# --------------------------------------------------------------------------- fuzz


def _check_partition(n, batch, rejects):
    got = sorted(batch.index.tolist() + [r.index for r in rejects])
    assert got == list(range(n))
    assert batch.index.tolist() == sorted(batch.index.tolist())
    assert [r.index for r in rejects] == sorted(r.index for r in rejects)
    for r in rejects:
        assert isinstance(r.reason, str) and r.reason and isinstance(r.detail, str)
        base = r.reason.split(":")[0]
        assert r.reason in REJECT_REASONS or f"{base}:<field>" in REJECT_REASONS
    assert np.isfinite(batch.score).all() if hasattr(batch, "score") else True


_mutated = st.builds(lambda raw, cut, junk: raw[:cut] + junk + raw[cut:],
                     st.builds(orjson.dumps, score_records()), st.integers(0, 300), st.binary(max_size=4))


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(st.binary(max_size=200), st.none(), _mutated,
                          st.builds(orjson.dumps, score_records()),
                          st.builds(orjson.dumps, _json)), max_size=12))
@example([b"1e999", b'{"score":1e999}', b"\x00", b"\xef\xbb\xbf{}", b"\xff\xfe{\x00}\x00", b"[" * 2000])
def test_parse_scores_never_raises_and_partitions(values):
    batch, rejects = parse_scores(values, [TS] * len(values), 0.5)
    _check_partition(len(values), batch, rejects)
    assert len(batch.classifier_id) == len(batch.item_id) == len(batch.score) == len(batch.context) \
        == len(batch.predicted_positive) == len(batch.event_time_ms) == len(batch.index)


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=100), st.none(), st.builds(orjson.dumps, label_records()),
                          st.builds(orjson.dumps, _json)), max_size=12))
def test_parse_labels_never_raises_and_partitions(values):
    batch, rejects = parse_labels(values, [TS] * len(values))
    _check_partition(len(values), batch, rejects)
    assert len(batch.request_id) == len(batch.label) == len(batch.labeler_id) == len(batch.labeled_at_ms)


# --------------------------------------------------------------------------- fast path == reference, on any bytes
# The fast path decodes with msgspec, the reference with orjson: these feed both the same raw
# bytes (not only orjson's own output), with the things the two libraries could read differently.

_HAZARDS = [b"1e999", b"-1e999", b"9" * 400, b'"\xff"', b'"\\ud800"', b"NaN", b"Infinity", b"[" * 300 + b"]" * 300,
            b"123456789012345678901234567890", b"-9223372036854775809", b"18446744073709551615", b"-0", b"1E2",
            b"0.1e-400", b'"\\u00e9"', b'"a\\nb"', b"{}", b"[]", b"null", b"true", b"", b"1.", b"01"]
_ws = st.sampled_from([b"", b" ", b"\n", b"\t ", b"\r\n  "])


@st.composite
def _raw_values(draw, fields: dict) -> bytes:
    """A JSON object as bytes: each field's value from its strategy (as orjson writes it) or
    a hazard, keys in any order, some repeated, fields of the producer's own, any whitespace."""
    pairs = []
    for name, (valid, anything) in fields.items():
        for _ in range(draw(st.sampled_from([1, 1, 1, 1, 0, 2]))):
            value = draw(st.one_of(valid, anything))
            if value is ...:
                continue
            raw = orjson.dumps(value) if draw(st.integers(0, 9)) else draw(st.sampled_from(_HAZARDS))
            pairs.append((orjson.dumps(name), raw))
    for _ in range(draw(st.integers(0, 2))):
        pairs.append((orjson.dumps(draw(st.sampled_from(["extra", "model_version", "é", ""]))),
                      draw(st.one_of(st.sampled_from(_HAZARDS), st.builds(orjson.dumps, _json)))))
    pairs = draw(st.permutations(pairs))
    w = lambda: draw(_ws)  # noqa: E731
    body = b",".join(w() + k + w() + b":" + w() + v + w() for k, v in pairs)
    return w() + b"{" + body + b"}" + w()


def _reference(value, row) -> tuple:
    return reference_rules.diagnose(value, MAX_RECORD_BYTES, row)


@pytest.mark.slow
@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_raw_values(_FIELDS), st.floats(-10, 10), _windows)
@example(b'{"classifier_id":"a","item_id":"b","score":0.5,"x":"\xff"}', 0.5, None)
@example(b'{"classifier_id":"a","item_id":"b","score":0.5,"x":1e999}', 0.5, None)
@example(b'{"classifier_id":"a","item_id":"b","score":"x","score":0.7}', 0.5, None)
@example(b'{"classifier_id":"a","item_id":"b","score":1,"context":{"k":123456789012345678901234567890}}', 0.5, None)
def test_parse_scores_agrees_with_the_reference_on_raw_bytes(value, threshold, window):
    batch, rejects = parse_scores([value], [TS], threshold, window=window)
    ref = _reference(value, lambda r: reference_rules.score_row(r, TS, lambda cid: threshold,
                                                                reference_rules.ANY_TIME if window is None else window))
    if len(ref) == 2:
        assert len(batch) == 0 and rejects == [Reject(0, *ref)], (value, ref)
        return
    assert rejects == [], (value, rejects)
    got = (batch.classifier_id[0], batch.item_id[0], float(batch.score[0]), bool(batch.predicted_positive[0]),
           int(batch.event_time_ms[0]), batch.context[0])
    cid, item, score, pp, et, ctx = ref
    assert got == (cid, item, float(score), bool(pp), et, ctx), value


@pytest.mark.slow
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(_raw_values(_FIELDS), st.builds(orjson.dumps, score_records()), st.none()), max_size=8),
       st.floats(-10, 10), _windows)
@example([enc(), enc(event_time=TS + 1), enc(event_time=TS + 10**8 + 1)], 0.5, (TS + 1, TS + 10**8))  # window edges
@example([enc(event_time=TS - 1), enc(), enc(event_time=TS + 1)], 0.5, (TS, TS))
@example([enc(), enc(event_time=TS + 2)], 0.5, (TS + 1, TS + 10**8))  # only the lower edge
@example([enc(event_time=TS + 2), enc()], 0.5, (TS - 10**8, TS + 1))  # only the upper edge
@example([enc(model_version="7"), b'{"classifier_id":"a","item_id":"b","score":0.5,"x":"\xff"}',
          b'{"classifier_id":"a","item_id":"b","score":0.5,"x":1e999}', enc()], 0.5, None)
@example([enc(context={"k": "v"}), enc(context={"k": "x" * MAX_CONTEXT_BYTES}), enc(predicted_positive=False),
          enc(classifier_id="a b"), enc(event_time="2024-06-10T08:13:20Z"), enc(event_time=1_718_000_000)], 0.5, None)
def test_parse_scores_agrees_with_the_reference_record_by_record_in_a_batch(values, threshold, window):
    # a batch decodes in one pass when every record is plain, else record by record (and,
    # after a record with a producer's own field, reads the next ones that way first)
    batch, rejects = parse_scores(values, [TS] * len(values), threshold, window=window)
    _check_partition(len(values), batch, rejects)
    rows = dict(zip(batch.index.tolist(), zip(batch.classifier_id, batch.item_id, batch.score.tolist(),
                                               batch.predicted_positive.tolist(), batch.event_time_ms.tolist(),
                                               batch.context)))
    reasons = {r.index: r.reason for r in rejects}
    for i, value in enumerate(values):
        ref = _reference(value, lambda r: reference_rules.score_row(r, TS, lambda cid: threshold,
                                                                    reference_rules.ANY_TIME if window is None else window))
        if len(ref) == 2:
            assert reasons[i] == ref[0], (value, ref)
        else:
            cid, item, score, pp, et, ctx = ref
            assert rows[i] == (cid, item, float(score), bool(pp), et, ctx), value


_LABEL_FIELDS = {
    "request_id": (st.text(min_size=1, max_size=5), st.one_of(st.text(min_size=255, max_size=258), _int64, st.none())),
    "label": (st.one_of(st.booleans(), st.none()), st.one_of(st.integers(0, 1), st.text(max_size=4), _absent)),
    "labeler_id": (st.one_of(st.text(max_size=5), st.none(), _absent), st.one_of(st.text(min_size=255, max_size=258),
                                                                                _int64)),
    "labeled_at": (st.one_of(_times, _absent), _times),
}


@pytest.mark.slow
@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_raw_values(_LABEL_FIELDS))
@example(b'{"request_id":"r","label":true,"x":"\xff"}')
@example(b'{"request_id":"r","label":true,"x":-1e999}')
@example(b'{"request_id":"r","label":1,"label":null}')
def test_parse_labels_agrees_with_the_reference_on_raw_bytes(value):
    batch, rejects = parse_labels([value], [TS])
    ref = _reference(value, lambda r: reference_rules.label_row(r, TS))
    if len(ref) == 2:
        assert len(batch) == 0 and rejects == [Reject(0, *ref)], (value, ref)
        return
    assert rejects == [], (value, rejects)
    assert (batch.request_id[0], batch.label[0], batch.labeler_id[0], int(batch.labeled_at_ms[0])) == ref


@pytest.mark.parametrize("value, code", [
    # msgspec skips a field it does not know without reading it; the contract still rejects these
    (b'{"classifier_id":"a","item_id":"b","score":0.5,"x":"\xff"}', "invalid_json"),
    (b'{"classifier_id":"a","item_id":"b","score":0.5,"x":1e999}', "invalid_json"),
    (b'{"classifier_id":"a","item_id":"b","score":0.5,"x":[' + b"9" * 400 + b"]}", "invalid_json"),
    (b'{"classifier_id":"a","item_id":"b","score":0.5,"x":"\\ud800"}', "invalid_json"),
    (b'{"classifier_id":"a","item_id":"b","score":0.5,"x":1,"score":"0.5"}', "wrong_type:score"),  # the last wins
])
def test_fields_of_the_producers_own_are_still_read_strictly(value, code):
    assert reason(value) == code


def test_repeated_keys_and_whitespace_read_as_the_reference_reads_them():
    assert accepted(b'{"classifier_id":"a","item_id":"b","score":"x","score":0.75}')["score"] == 0.75
    assert accepted(b' {\n "classifier_id" : "a" ,\t"item_id":"b", "score": 1E0 } \n')["score"] == 1.0
    # an integer beyond 64 bits in a context: a float to orjson, so to the service too
    got = accepted(b'{"classifier_id":"a","item_id":"b","score":1,"context":{"n":123456789012345678901234567890}}')
    assert got["context"] == '{"n":1.2345678901234568e+29}'


def test_codec_round_trips_every_message():
    raw = score_record_bytes("fraud-v3", "txn-1", 0.7, event_time=TS, context={"k": "v"})
    assert accepted(raw) == {"classifier_id": "fraud-v3", "item_id": "txn-1", "score": 0.7,
                             "predicted_positive": True, "event_time_ms": TS, "context": '{"k":"v"}'}
    assert orjson.loads(score_record_bytes("a", "b", np.float64(0.25))) == {
        "classifier_id": "a", "item_id": "b", "score": 0.25}
    batch, rejects = parse_labels([label_record_bytes("fraud-v3/t", None, "ann", "2024-06-10T08:13:20Z"),
                                   label_record_bytes("fraud-v3/u", True)], [TS, TS])
    assert rejects == [] and batch.label == [None, True] and batch.labeler_id == ["ann", None]
    assert batch.labeled_at_ms.tolist() == [1_718_007_200_000, TS]
    req = decode_label_request(label_request_bytes("fraud-v3/t", "fraud-v3", "txn-1", 0.9, 1, 0, 1, b'{"k":"v"}'))
    assert (req.request_id, req.stratum, req.requested_at, req.context) == (
        "fraud-v3/t", 1, "1970-01-01T00:00:00.000Z", {"k": "v"})
    dead = DeadLetter.model_validate_json(dead_letter_record(b"{", None, TOPIC_SCORES, 0, 7, "invalid_json", "d", 0))
    assert (dead.offset, dead.reason) == (7, "invalid_json")
    with pytest.raises(ValidationError):
        decode_label_request(b'{"request_id":"r"}')


# --------------------------------------------------------------------------- times


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.timezones()),
       st.sampled_from(["T", "t", " "]), st.integers(0, 9))
def test_rfc3339_fast_path_matches_the_reference(dt, sep, digits):
    off = dt.utcoffset()
    if off is None or off.seconds % 60 or abs(off) >= timedelta(hours=24):
        return
    minutes = int(off.total_seconds() // 60)
    sign = "+" if minutes >= 0 else "-"
    frac = f".{dt.microsecond:06d}{'7' * digits}"[: 1 + digits] if digits else ""
    text = (f"{dt.year:04d}-{dt.month:02d}-{dt.day:02d}{sep}{dt:%H:%M:%S}{frac}"
            f"{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}")
    ms = rfc3339_to_ms(text)
    assert ms == _rfc3339_to_ms_by_parts(text)
    utc = dt.replace(microsecond=int((frac[1:] + "000000")[:6]) if frac else 0).astimezone(timezone.utc)
    expected = (utc - datetime(1970, 1, 1, tzinfo=timezone.utc)) // timedelta(milliseconds=1)
    assert ms == (expected if -62_135_596_800_000 <= expected <= 253_402_300_799_999 else None)


def test_format_time_roundtrip():
    for ms in (0, -1, 1_718_007_200_123, -62_135_596_800_000, 253_402_300_799_999):
        text = format_time(ms)
        assert text.endswith("Z") and len(text) == 24
        assert rfc3339_to_ms(text) == ms
    assert format_time(1_718_007_200_000) == "2024-06-10T08:13:20.000Z"


# --------------------------------------------------------------------------- outbound


def test_label_request_bytes():
    ctx = orjson.dumps({"country": "DE", "amount": 12.5})
    raw = label_request_bytes("fraud-v3/tok", "fraud-v3", "txn-1", np.float64(0.93), np.int64(2),
                              1_718_007_200.0, datetime(2024, 6, 11, 8, 13, 20, tzinfo=timezone.utc), ctx)
    assert ctx in raw  # embedded as is
    doc = orjson.loads(raw)
    assert doc == {"request_id": "fraud-v3/tok", "classifier_id": "fraud-v3", "item_id": "txn-1", "score": 0.93,
                   "stratum": 2, "predicted_positive": True, "requested_at": "2024-06-10T08:13:20.000Z",
                   "expires_at": "2024-06-11T08:13:20.000Z", "context": {"country": "DE", "amount": 12.5}}
    LabelRequest.model_validate_json(raw)
    # a predicted negative (recall, F1, accuracy): its strata come after the positives'
    negative = LabelRequest.model_validate_json(label_request_bytes("c~negatives/t", "c", "i", 0.1, 5, 0, 1, None,
                                                                    predicted_positive=False))
    assert negative.predicted_positive is False and negative.stratum == 5
    raw = label_request_bytes("r", "c", "i", 1, 0, datetime(2024, 6, 10, 10, 13, 20, tzinfo=timezone(timedelta(hours=2))),
                              datetime(2024, 6, 10, 8, 13, 21), None)
    doc = LabelRequest.model_validate_json(raw)
    assert doc.context is None and doc.requested_at == "2024-06-10T08:13:20.000Z"
    assert doc.expires_at == "2024-06-10T08:13:21.000Z"
    assert orjson.loads(label_request_bytes("r", "c", "i", 0.1, 0, 0, 1, {"a": [1]}))["context"] == {"a": [1]}
    with pytest.raises(ValueError):
        label_request_bytes("r", "c", "i", math.nan, 0, 0, 1)
    # the context column of parse_scores goes straight into a request
    batch, _ = parse_scores([enc(context={"k": "v"})], [TS], 0.5)
    raw = label_request_bytes("r", batch.classifier_id[0], batch.item_id[0], batch.score[0], 0, 0, 1, batch.context[0])
    assert LabelRequest.model_validate_json(raw).context == {"k": "v"}


def test_dead_letter_record():
    raw = dead_letter_record(b'{"score":"x"}', b"fraud-v3", "stratameter.scores", 3, 1234, "wrong_type:score",
                             "score: expected a number, got string", 1_718_007_200.5)
    doc = DeadLetter.model_validate_json(raw)
    assert base64.b64decode(doc.original) == b'{"score":"x"}' and base64.b64decode(doc.key) == b"fraud-v3"
    assert (doc.topic, doc.partition, doc.offset, doc.reason) == ("stratameter.scores", 3, 1234, "wrong_type:score")
    assert doc.rejected_at == "2024-06-10T08:13:20.500Z" and doc.truncated is False

    tomb = DeadLetter.model_validate_json(dead_letter_record(None, None, "t", 0, 0, "tombstone", "null",
                                                             datetime(2024, 6, 10, tzinfo=timezone.utc)))
    assert tomb.original is None and tomb.key is None and tomb.rejected_at == "2024-06-10T00:00:00.000Z"
    empty = DeadLetter.model_validate_json(dead_letter_record(b"", b"", "t", 0, 0, "tombstone", "empty", 0))
    assert empty.original == "" and empty.key == ""


def test_dead_letter_is_bounded():
    value = bytes(range(256)) * 1000   # 256 KB
    key = b"k" * 5000
    detail = "é" * 5000
    raw = dead_letter_record(value, key, "t", 0, 0, "too_large", detail, 0)
    doc = DeadLetter.model_validate_json(raw)
    assert doc.truncated is True
    assert base64.b64decode(doc.original) == value[:MAX_DEAD_LETTER_ORIGINAL_BYTES]
    assert base64.b64decode(doc.key) == key[:MAX_DEAD_LETTER_KEY_BYTES]
    assert len(doc.detail.encode()) <= MAX_DEAD_LETTER_DETAIL_BYTES and doc.detail.endswith("...")
    assert len(raw) < MAX_DEAD_LETTER_ORIGINAL_BYTES * 4 // 3 + 4 * 1024
    ok = DeadLetter.model_validate_json(dead_letter_record(b"x" * MAX_DEAD_LETTER_ORIGINAL_BYTES, None, "t", 0, 0,
                                                           "too_large", "d", 0))
    assert ok.truncated is False


def test_every_reject_makes_a_valid_dead_letter():
    values = [None, b"", b"{", b"[]", enc(score="1"), enc(score=True), b'{"classifier_id":"a","item_id":"b","score":NaN}',
              enc(context=BIG_CONTEXT), enc(event_time="x" * 5000), b"x" * 70_000]
    batch, rejects = parse_scores(values, [TS] * len(values), 0.5)
    assert len(batch) == 0
    for r in rejects:
        doc = DeadLetter.model_validate_json(
            dead_letter_record(values[r.index], None, TOPIC_SCORES, 0, r.index, r.reason, r.detail, 0))
        assert doc.reason == r.reason
