"""`streams.labels_to_reach` and `streams.shortfall_round` against their definition.

The service's and the simulations' versions evaluate the closed chunk's interval of precision
at all the factors of a pass at once (`widths.ClosedWidths`: the interval's own functions,
`wilson`, with the per-stratum parts that do not depend on the added labels computed once per
call, both forecasts of a round and today's width in one evaluation).  The
reference below is the search as it was first written, one `streams.chunk_interval` per pass
and forecast; the two must agree exactly (not approximately: the simulations' results must not
move) on random chunks, including the edge cases of the interval (empty strata, strata with
fewer than two labels, pure strata, fully labelled strata, counts above the stratum size)."""

from __future__ import annotations

import numpy as np
import pytest

from stratameter.stats import streams
from stratameter.stats.allocation import pseudo_smoothed


def reference_labels_to_reach(N, n, h, delta, confidence, p=None, passes=4, grid=32, target=None):
    N = np.asarray(N, dtype=float)
    n = np.asarray(n, dtype=float)
    h = np.asarray(h, dtype=float)
    p = h / np.maximum(n, 1.0) if p is None else np.asarray(p, dtype=float)
    N, n, p = np.broadcast_arrays(N, n, p)
    cap = np.maximum(N, n)
    grown = lambda t: np.minimum(n[..., None, :] * t[..., None], cap[..., None, :])  # noqa: E731

    def width(t):
        m = grown(t)
        full = lambda a: np.broadcast_to(a[..., None, :], m.shape)  # noqa: E731
        with np.errstate(invalid="ignore"):  # inf labels: chunk_interval refuses them
            positives = full(p) * m
        return streams.chunk_interval(full(N), m, positives, confidence, True, target).halfwidth

    now = width(np.ones(N.shape[:-1] + (1,)))[..., 0]
    lo = np.ones(N.shape[:-1])
    with np.errstate(divide="ignore"):
        hi = np.maximum(np.max(np.where(n > 0, N / np.maximum(n, 1.0), 1.0), axis=-1), 1.0)
    steps = np.arange(1, grid + 1) / grid
    for _ in range(passes):
        cand = lo[..., None] * (hi / lo)[..., None] ** steps
        ok = width(cand) <= delta
        first = np.argmax(ok, axis=-1)
        found = ok.any(axis=-1)
        below = np.take_along_axis(cand, np.maximum(first - 1, 0)[..., None], axis=-1)[..., 0]
        at = np.take_along_axis(cand, first[..., None], axis=-1)[..., 0]
        lo = np.where(found & (first > 0), below, np.where(found, lo, hi))
        hi = np.where(found, at, hi)
    short = np.isfinite(now) & (now > delta)
    return np.where(short, grown(hi[..., None])[..., 0, :].sum(axis=-1), n.sum(axis=-1))


def reference_shortfall_round(D, N, n, h, q, delta, confidence, closed, target=None, variance_ratio=1.0):
    closed = np.asarray(closed, dtype=bool)
    if not closed.any():
        return np.broadcast_to(np.asarray(D, dtype=np.int64), np.shape(n)[:-1]).copy()
    total = np.sum(n, axis=-1)
    need = np.minimum(reference_labels_to_reach(N, n, h, delta, confidence, target=target),
                      reference_labels_to_reach(N, n, h, delta, confidence, pseudo_smoothed(n, h, q), target=target))
    missing = np.maximum(need * np.asarray(variance_ratio, dtype=float) - total, 0.0)
    share = np.ceil(streams.SHORTFALL_SHARE * missing)
    if target is None or not target.has_ratio:
        share = np.minimum(share, np.floor(streams.SHORTFALL_GROWTH * total))
    return np.where(closed, np.maximum(D, share), D).astype(np.int64)


def random_chunk(rng: np.random.Generator, shape: tuple[int, ...], K: int):
    """Stratum sizes, labels and positives with the interval's edge cases mixed in."""
    scale = rng.choice([5.0, 200.0, 5e3, 2e5, 1e9], size=shape + (K,))
    N = np.floor(rng.random(shape + (K,)) * scale)
    N = np.where(rng.random(N.shape) < 0.08, 0.0, N)  # empty strata
    share = rng.choice([0.0, 1e-4, 1e-3, 0.01, 0.05, 0.3, 1.0], size=N.shape)
    n = np.floor(N * share * rng.random(N.shape))
    if rng.random() < 0.7:  # most chunks have an interval: two labels at least where there are items
        n = np.where(N > 0, np.maximum(n, np.minimum(2.0, N)), n)
    n = np.where(rng.random(N.shape) < 0.03, rng.integers(0, 3, N.shape), n)  # 0, 1 or 2 labels
    n = np.where(rng.random(N.shape) < 0.03, N + rng.integers(0, 3, N.shape), n)  # a census, or more
    n = np.where(rng.random(N.shape) < 0.1, n + rng.integers(2, 400, N.shape), n)  # a usual round's counts
    p = rng.choice([0.0, 1.0, 0.5, 0.9, 0.99, -1.0], size=N.shape)
    p = np.where(p < 0, rng.random(N.shape), p)
    h = np.floor(n * p + rng.random(N.shape) * (p > 0) * (p < 1))
    h = np.clip(h, 0, n)
    q = rng.random(N.shape) ** rng.choice([0.2, 1.0, 5.0])
    return N, n, h, q


@pytest.mark.slow
def test_labels_to_reach_equals_its_definition_on_random_chunks():
    rng = np.random.default_rng(13)
    checked = short = 0
    for case in range(600):
        K = int(rng.integers(1, 13))
        shape = [(), (int(rng.integers(1, 7)),), (2, int(rng.integers(1, 4)))][case % 3]
        N, n, h, q = random_chunk(rng, shape, K)
        if not (N.sum(axis=-1) > 0).all():
            continue
        delta = float(rng.choice([0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.1]))
        confidence = float(rng.choice([0.8, 0.9, 0.95, 0.99]))
        passes, grid = [(4, 32), (4, 32), (1, 8), (0, 32), (3, 5)][case % 5]
        for p in (None, pseudo_smoothed(n, h, q), rng.random(N.shape)):
            got = streams.labels_to_reach(N, n, h, delta, confidence, p, passes, grid)
            want = reference_labels_to_reach(N, n, h, delta, confidence, p, passes, grid)
            assert got.shape == want.shape and got.dtype == want.dtype
            assert np.array_equal(got, want, equal_nan=True), (case, N, n, h, p)
            checked += 1
            short += int(np.sum(got != np.sum(n, axis=-1)))
    assert checked > 1500 and short > 500  # most cases searched, not only today's labels returned


@pytest.mark.slow
def test_shortfall_round_equals_its_definition_on_random_chunks():
    rng = np.random.default_rng(31)
    moved = 0
    for case in range(400):
        K = int(rng.integers(1, 9))
        shape = [(), (int(rng.integers(1, 9)),)][case % 2]
        N, n, h, q = random_chunk(rng, shape, K)
        if not (N.sum(axis=-1) > 0).all():
            continue
        closed = rng.random(shape) < 0.7 if shape else bool(rng.random() < 0.8)
        ratio = rng.uniform(0.5, 1.0, shape) if case % 3 == 0 else 1.0
        delta = float(rng.choice([0.005, 0.01, 0.02, 0.05]))
        got = streams.shortfall_round(8, N, n, h, q, delta, 0.95, closed, variance_ratio=ratio)
        want = reference_shortfall_round(8, N, n, h, q, delta, 0.95, closed, variance_ratio=ratio)
        assert got.dtype == want.dtype and np.array_equal(got, want), (case, N, n, h, q)
        moved += int(np.sum(got > 8))
    assert moved > 120


@pytest.mark.slow
def test_shortfall_round_equals_its_definition_in_the_simulations_rounds():
    """The counts `simulate --calibration` meets on steep: a closed chunk of four strata from its
    first round to its stop."""
    from stratameter.simulate.calibrated import Chunk
    from stratameter.simulate.populations import builtin

    chunk = Chunk.of(builtin("steep"))
    rng = np.random.default_rng(5)
    for _ in range(300):
        n = np.minimum(np.floor(rng.uniform(2, 400, 4)), chunk.N)
        h = np.floor(n * rng.uniform(0.5, 1.0, 4))
        for delta in (0.01, 0.02):
            got = streams.shortfall_round(8, chunk.N, n, h, chunk.prior, delta, 0.95, True)
            assert got == reference_shortfall_round(8, chunk.N, n, h, chunk.prior, delta, 0.95, True)


@pytest.mark.parametrize("N, n, h, message", [
    ([np.nan, 10.0], [2.0, 2.0], [1.0, 1.0], "stratum sizes must be finite"),
    ([10.0, 10.0], [2.0, np.inf], [1.0, 1.0], "finite"),
    ([10.0, 10.0], [2.0, -1.0], [1.0, 0.0], "0 <= positives <= labels"),
    ([-10.0, 10.0], [2.0, 2.0], [1.0, 1.0], ">= 0"),
    ([0.0, 0.0], [0.0, 0.0], [0.0, 0.0], "empty"),
])
def test_labels_to_reach_refuses_what_its_definition_refuses(N, n, h, message):
    with pytest.raises(ValueError, match=message):
        reference_labels_to_reach(N, n, h, 0.02, 0.95)
    with pytest.raises(ValueError, match=message):
        streams.labels_to_reach(N, n, h, 0.02, 0.95)
    with pytest.raises(ValueError, match=message):
        streams.labels_to_reach(N, n, h, 0.02, 0.95, p=[0.5, 0.5])


def test_labels_to_reach_refuses_proportions_above_one_where_labels_are():
    with pytest.raises(ValueError, match="0 <= positives <= labels"):
        reference_labels_to_reach([10.0, 10.0], [2.0, 2.0], [1.0, 1.0], 0.02, 0.95, p=[0.5, 1.5])
    with pytest.raises(ValueError, match="0 <= positives <= labels"):
        streams.labels_to_reach([10.0, 10.0], [2.0, 2.0], [1.0, 1.0], 0.02, 0.95, p=[0.5, 1.5])


@pytest.mark.slow
def test_shortfall_round_with_a_target_equals_its_definition():
    """Recall, F1 and accuracy keep the generic search (`chunk_interval` with the target); a
    precision-only `Target` takes `widths.ClosedWidths`."""
    from stratameter.stats.target import Target

    rng = np.random.default_rng(7)
    targets = [Target.precision(4), Target(("recall", "f1"), [True, True, False, False]),
               Target(("accuracy",), [True, True, False, False])]
    for case in range(60):
        N = np.floor(rng.uniform(50, 5e4, (3, 4)))
        n = np.floor(rng.uniform(2, 300, (3, 4)))
        h = np.floor(n * rng.uniform(0.0, 1.0, (3, 4)))
        q = rng.random((3, 4))
        target = targets[case % 3]
        closed = rng.random(3) < 0.7
        got = streams.shortfall_round(8, N, n, h, q, 0.03, 0.95, closed, target=target)
        want = reference_shortfall_round(8, N, n, h, q, 0.03, 0.95, closed, target=target)
        assert np.array_equal(got, want), (case, target.metrics)
