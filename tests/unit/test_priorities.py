"""Sampling priorities drawn from item ids (service/ingest/priorities.py, a group that shares items)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from stratameter.ingest.aggregate import ClassifierRecords, build_payload
from stratameter.ingest.priorities import item_priorities

pytestmark = pytest.mark.unit


def chunk(t: int, n: int) -> np.ndarray:
    return np.full(n, t, dtype=np.int64)


def test_one_item_one_priority_whoever_scores_it_in_a_chunk():
    a = item_priorities(["x1", "x2", "x3"], chunk(7, 3), "team")
    assert np.array_equal(a, item_priorities(["x1", "x2", "x3"], chunk(7, 3), "team"))
    assert np.array_equal(a[[2, 0]], item_priorities(["x3", "x1"], chunk(7, 2), "team"))
    assert not np.array_equal(a, item_priorities(["x1", "x2", "x3"], chunk(7, 3), "other"))  # keyed by the group
    assert not np.any(a == item_priorities(["x1", "x2", "x3"], chunk(8, 3), "team"))  # afresh in another chunk


def test_a_hand_computed_priority():
    """BLAKE2b-64 of b"7:x1" keyed b"team", its top 53 bits over 2^53."""
    from hashlib import blake2b

    word = int.from_bytes(blake2b(b"7:x1", digest_size=8, key=b"team").digest(), "big")
    assert item_priorities(["x1"], chunk(7, 1), "team")[0] == (word >> 11) / 2**53


@pytest.mark.parametrize("ids, chunks", [
    ([f"order-{i}" for i in range(100_000)], chunk(7, 100_000)),  # sequential ids in one chunk
    (["same-item"] * 100_000, np.arange(100_000)),  # one item scored in every chunk
])
def test_priorities_are_uniform_and_independent_of_the_order(ids, chunks):
    """A Kolmogorov-Smirnov test against U(0, 1) and the correlation of neighbours (alpha 0.001:
    these fixed ids pass or fail always, never by chance)."""
    p = item_priorities(ids, chunks, "team")
    assert p.min() >= 0 and p.max() < 1
    assert stats.kstest(p, "uniform").pvalue > 0.001
    assert abs(np.corrcoef(p[:-1], p[1:])[0, 1]) < 0.015


def test_the_payload_of_a_sharing_classifier_carries_the_items_priorities():
    items = [f"i{j}" for j in range(6)]
    recs = ClassifierRecords("c", np.arange(6), np.arange(6), items, [None] * 6, np.linspace(0.1, 0.9, 6),
                             np.ones(6, bool), np.full(6, 3_600_000))
    cuts = type("Cuts", (), {"cuts": np.array([]), "version": 1, "provisional": False})()
    payload = build_payload(recs, 3600, lambda t: cuts, 64, 0, np.random.default_rng(0), sharing_group="team")
    flat = payload["chunks"][0]["res"][0][1]
    got = {item: float(p) for p, item in zip(flat[0::2], (m.split('"i":"')[1].split('"')[0] for m in flat[1::2]))}
    assert got == dict(zip(items, item_priorities(items, chunk(1, 6), "team").tolist()))
