"""The ingest aggregation's bulk encoders give exactly what their one-item references give."""

from __future__ import annotations

import numpy as np
import pytest
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from stratameter.ingest.aggregate import (SAMPLE_CAP, ClassifierRecords, build_payload, distinct_chunks,
                                          float_texts, member, members)
from stratameter.state.scripts import decode_ingest, encode_ingest
from stratameter.state.records import ChunkCuts

# item ids as the parser admits them: any text of 1-512 characters (no lone surrogates: not UTF-8)
_ids = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=40)
_scores = st.floats(allow_nan=False, allow_infinity=False)
_contexts = st.one_of(
    st.none(), st.just(""),
    st.dictionaries(st.text(max_size=8), st.one_of(st.text(max_size=8), st.integers(-2**63, 2**63 - 1), st.floats(allow_nan=False)),
                    max_size=3).map(lambda d: orjson.dumps(d).decode()),
    st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3).map(orjson.dumps),  # bytes
)


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(_ids, _scores, _contexts), max_size=30))
def test_members_are_member_of_each_item(rows):
    ids = [r[0] for r in rows]
    assert members(ids, [r[1] for r in rows], [r[2] for r in rows]) == [member(*r) for r in rows]
    assert members(ids, np.array([r[1] for r in rows], dtype=float), [r[2] for r in rows]) == \
        [member(*r) for r in rows]


@settings(max_examples=400, deadline=None)
@given(st.lists(_scores, max_size=30))
def test_float_texts_read_back_as_the_same_floats(values):
    """What INGEST passes to ZADD as a priority is the float itself, from a list or an array."""
    for given_as in (values, np.array(values, dtype=float)):
        texts = float_texts(given_as)
        assert all(type(t) is str and "," not in t for t in texts)
        assert [float(t) for t in texts] == values


def test_members_of_ids_that_look_like_separators():
    ids = ['","', '"', "\\", 'a\\","b', "\u2028", "é", "\x00", "x" * 512]
    scores = [0.0, -0.0, 1e-300, 5e-324, 1e300, -2.5, 0.1, 1e16]
    ctx = [None, '{"a":","}', b'{"b":"\\""}', "", None, '{}', None, '{"s":"s1"}']
    assert members(ids, scores, ctx) == [member(*r) for r in zip(ids, scores, ctx)]
    assert [orjson.loads(m)["i"] for m in members(ids, scores, ctx)] == ids


def test_members_of_an_id_ending_in_a_quote_and_a_comma():
    """'a",' is "a\\"," in JSON: its escaped quote, its comma and its closing quote read as the
    separator '","' of a list of ids, which once cut it and gave the next item's member its tail."""
    ids = ['a",', "b", '",', '",","', "c"]
    out = members(ids, [0.1, 0.2, 0.3, 0.4, 0.5], [None] * 5)
    assert out == [member(i, s, None) for i, s in zip(ids, [0.1, 0.2, 0.3, 0.4, 0.5])]
    assert [orjson.loads(m)["i"] for m in out] == ids


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(st.lists(st.text(alphabet='",\\a', min_size=1, max_size=6), max_size=12))
def test_members_of_ids_made_of_quotes_commas_and_backslashes(ids):
    scores = [float(i) for i in range(len(ids))]
    assert members(ids, scores, [None] * len(ids)) == [member(i, s, None) for i, s in zip(ids, scores)]


def test_ingest_payload_round_trips_exactly():
    payload = {"scores": 3, "now": 1_800_000_000_123, "last_event": -1, "res_size": 1024, "sample_cap": 4,
               "chunks": [{"t": "500000", "hist": ["INCRBY", "u32", "#2", 3], "N": [0, 2, 1, 1],
                           "res": [[0, [0.1234567890123456, member("i", 0.3, None)]]],
                           "lo": 5e-324, "hi": 1e300, "lo_s": repr(5e-324), "hi_s": repr(1e300), "v": 2},
                          {"t": "500001", "runs": [[8, b"\x00\xff", b"\x01\x00"], [4096, b"", b""],
                                                   [12, b"\xfe" * 8, b"\xff" * 8]],
                           "N": [0, 1], "res": [], "v": 0}]}
    encoded = encode_ingest(payload)
    assert decode_ingest(encoded) == payload
    assert encoded.blob == b"\x00\xff\x01\x00" + b"\xfe" * 8 + b"\xff" * 8


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 400), st.integers(0, 2**32 - 1), st.integers(1, 40), st.booleans())
def test_reservoir_candidates_are_each_stratums_lowest_priorities(n, seed, res_size, known):
    """Per stratum: the records under its cutoff (`known`: a full reservoir's, at most SAMPLE_CAP x the
    reservoir size), else the batch's `res_size` lowest priorities, each as ``[priority,
    member(...)]``: what one item at a time gives (the bulk path builds every stratum's in one pass)."""
    rng = np.random.default_rng(seed)
    score = rng.random(n)
    items = [f"it-{i}" for i in range(n)]
    contexts = [None if i % 3 == 0 else orjson.dumps({"k": i}).decode() for i in range(n)]
    recs = ClassifierRecords("c", np.arange(n), np.arange(n), items, contexts, score, rng.random(n) < 0.7,
                             np.full(n, 7_200_000))
    cuts = np.array([0.3, 0.6, 0.8])
    cutoff = np.array([0.5, np.inf, 0.9, 0.2]) if known else None
    payload = build_payload(recs, 3600, lambda t: ChunkCuts(cuts, 1, False), res_size, 0,
                            np.random.default_rng(seed), (lambda t: cutoff) if known else None)
    priority = np.random.default_rng(seed).random(n)  # the draw build_payload makes first
    stratum = np.searchsorted(cuts, score, side="right")
    expected = []
    for k in range(cuts.size + 1):
        rows = [i for i in range(n) if recs.positive[i] and stratum[i] == k]
        if cutoff is not None:
            rows = [i for i in rows if priority[i] <= cutoff[k]]
        limit = SAMPLE_CAP * res_size if cutoff is not None and np.isfinite(cutoff[k]) else res_size
        if len(rows) > limit:
            lowest = set(sorted(rows, key=lambda i: priority[i])[:limit])
            rows = [i for i in rows if i in lowest]
        if rows:
            expected.append([k, [x for i in rows for x in (float(priority[i]),
                                                           member(items[i], float(score[i]), contexts[i]))]])
    got = payload["chunks"][0]["res"] if payload["chunks"] else []
    assert all(type(p) is str for _, c in got for p in c[0::2])  # priorities as text: `float_texts`
    assert [[k, sorted(zip(map(float, c[0::2]), c[1::2]))] for k, c in got] == \
        [[k, sorted(zip(c[0::2], c[1::2]))] for k, c in expected]


def test_distinct_chunks_in_order_with_or_without_a_sort():
    assert distinct_chunks(np.empty(0, dtype=np.int64)) == []
    assert distinct_chunks(np.array([7, 7, 7])) == [7]
    assert distinct_chunks(np.array([9, 7, 9, 8, 7])) == [7, 8, 9]
    assert all(type(t) is int for t in distinct_chunks(np.array([5, 4])) + distinct_chunks(np.array([3, 3])))


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 300), st.integers(0, 2**32 - 1), st.integers(1, 3))
def test_both_sides_from_one_pass_are_each_side_alone(n, seed, chunks):
    """A classifier's predicted positives and negatives (`negatives`) share their records' chunk
    ids, score buckets and priorities (one draw: a record is on one side): each side's payload is
    the one it gets alone, with the priorities of that one draw."""
    rng = np.random.default_rng(seed)
    score = rng.normal(size=n)
    event_ms = np.sort(rng.integers(0, chunks * 3_600_000, n))
    cols = (np.arange(n), np.arange(n), [f"it-{i}" for i in range(n)], [None] * n, score, score >= 0.2, event_ms)
    cuts = ChunkCuts(np.array([-0.5, 0.0, 0.5]), 1, False)

    def payload(recs, draw):
        return build_payload(recs, 3600, lambda t: cuts, 16, 0, np.random.default_rng(draw))

    both = ClassifierRecords("c", *cols)
    negatives = both.negatives("c~negatives")
    shared = payload(both, seed), payload(negatives, seed + 1)  # the second draw is not made
    alone = payload(ClassifierRecords("c", *cols), seed), \
        payload(ClassifierRecords("c~negatives", *cols[:5], ~cols[5], cols[6]), seed)
    assert shared == alone
    assert sum(len(c["res"]) for p in shared for c in p["chunks"]) > 0
