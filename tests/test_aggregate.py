"""The ingest aggregation's bulk encoders give exactly what their one-item references give."""

from __future__ import annotations

import numpy as np
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from stratameter.ingest.aggregate import _COUNTER_OFFSET, _histogram_increments, member, members
from stratameter.state.records import BINS_ROTATION
from stratameter.state.scripts import decode_ingest, encode_ingest
from stratameter.stats.sketch import BINS

# item ids as the parser admits them: any text of 1-512 characters (no lone surrogates: not UTF-8)
_ids = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=40)
_scores = st.floats(allow_nan=False, allow_infinity=False)
_contexts = st.one_of(
    st.none(), st.just(""),
    st.dictionaries(st.text(max_size=8), st.one_of(st.text(max_size=8), st.integers(-2**63, 2**63 - 1), st.floats(allow_nan=False)),
                    max_size=3).map(lambda d: orjson.dumps(d).decode()),
    st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3).map(orjson.dumps),  # bytes
)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(_ids, _scores, _contexts), max_size=30))
def test_members_are_member_of_each_item(rows):
    ids = [r[0] for r in rows]
    assert members(ids, [r[1] for r in rows], [r[2] for r in rows]) == [member(*r) for r in rows]


def test_members_of_ids_that_look_like_separators():
    ids = ['","', '"', "\\", 'a\\","b', "\u2028", "é", "\x00", "x" * 512]
    scores = [0.0, -0.0, 1e-300, 5e-324, 1e300, -2.5, 0.1, 1e16]
    ctx = [None, '{"a":","}', b'{"b":"\\""}', "", None, '{}', None, '{"s":"s1"}']
    assert members(ids, scores, ctx) == [member(*r) for r in zip(ids, scores, ctx)]
    assert [orjson.loads(m)["i"] for m in members(ids, scores, ctx)] == ids


def test_histogram_increments_are_bitfield_arguments():
    buckets, counts = np.array([0, 2047, 2048, BINS - 1]), np.array([3, 1, 7, 2])
    out = _histogram_increments(buckets, counts)
    assert out == ["INCRBY", "u32", f"#{BINS_ROTATION}", 3, "INCRBY", "u32", f"#{BINS - 1}", 1,
                   "INCRBY", "u32", "#0", 7, "INCRBY", "u32", f"#{BINS_ROTATION - 1}", 2]
    assert _COUNTER_OFFSET.size == BINS


def test_ingest_payload_round_trips_exactly():
    payload = {"scores": 3, "now": 1_800_000_000_123, "last_event": -1, "res_size": 1024, "sample_cap": 4,
               "chunks": [{"t": "500000", "hist": ["INCRBY", "u32", "#2", 3], "N": [0, 2, 1, 1],
                           "res": [[0, [0.1234567890123456, member("i", 0.3, None)]]],
                           "lo": 5e-324, "hi": 1e300, "lo_s": repr(5e-324), "hi_s": repr(1e300), "v": 2}]}
    assert decode_ingest(encode_ingest(payload)) == payload
