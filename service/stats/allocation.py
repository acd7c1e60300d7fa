"""How many of a round's labels go to each stratum.

Every function takes the state of one or many runs as arrays whose last axis
is the stratum axis (``N`` sizes, ``n`` labels so far, ``h`` positives so
far, ``q`` mean calibrated score per stratum) and returns an integer array of
the same shape whose rows sum to the round size (less only when sampling
without replacement has labelled the whole population: labels a full stratum
cannot take go to the strata with room), and never give labels to a stratum
with no items (``N_k = 0``).

Methods:
* ``opt``       Bennett & Carvalho (2010, Fig. 1): counts drawn from
  ``Multinomial(D, N_k sigma_k)`` with the m-estimate smoothed ``sigma_k``.
* ``opt_a1``    Kumar & Raj (Alg. 1): ``n_ini`` per stratum, then Neyman
  allocation (Eq. 9) on the sample variances of those first labels alone.
* ``opt_a2``    Kumar & Raj (Alg. 2): ``n_ini`` per stratum, then ``n_step``
  per round by Neyman allocation (Eq. 9) on the plain sample variances.
* ``opt_conf``  Druck & McCallum (2011, Sec. 5.1, "opt conf online"): as
  ``opt`` but ``sigma_k`` comes from the labels mixed with pseudo-observations
  drawn from the scores as if calibrated (total weight ``PSEUDO_WEIGHT``).
* ``opt_track`` stratameter's default, see `allocate_opt_track`.
* ``pps``       proportional to ``N_k``;  ``uni``  equal;  ``random`` one
  stratum (simple random sampling; the caller stratifies with K = 1).
"""

from __future__ import annotations

import numpy as np

from .estimator import bennett_smoothed, half_label_smoothed

ALLOCATIONS: tuple[str, ...] = ("opt_track", "opt", "opt_a1", "opt_a2", "opt_conf", "pps", "uni", "random")
DEFAULT_ALLOCATION = "opt_track"
#: what the service runs: its stream design (`streams`) paces and tops up by ``opt_track``
SERVICE_ALLOCATIONS: tuple[str, ...] = (DEFAULT_ALLOCATION,)

#: Druck & McCallum (2011, Sec. 5.2) smooth with 10 pseudo-observations (alpha = 10/N_i).
PSEUDO_WEIGHT = 10.0
#: Labels every stratum gets before any variance-driven allocation.
MIN_LABELS_PER_STRATUM = 2


def round_size(k: int, per_stratum: int = 2) -> int:
    """Bennett & Carvalho's budget: two labels per stratum per round."""
    return max(1, per_stratum * k)


def largest_remainder(shares: np.ndarray, total) -> np.ndarray:
    """Integer counts proportional to `shares` summing exactly to `total` (rows).

    Hamilton's method: floor, then one more to the largest remainders.  Rows
    whose shares are all zero are split evenly.
    """
    shares = np.asarray(shares, dtype=float)
    total = np.broadcast_to(np.asarray(total), shares.shape[:-1]).astype(np.int64)
    s = shares.sum(axis=-1, keepdims=True)
    even = np.full_like(shares, 1.0 / shares.shape[-1])
    frac = np.where(s > 0, shares / np.where(s > 0, s, 1.0), even)
    exact = frac * total[..., None]
    base = np.floor(exact).astype(np.int64)
    short = total - base.sum(axis=-1)
    rank = np.argsort(np.argsort(-(exact - base), axis=-1, kind="stable"), axis=-1)
    return base + (rank < short[..., None])


def room_left(N, n, capacity=None) -> np.ndarray:
    """Labels each stratum can still take: its unlabelled items, within its `capacity` (the most
    labels it can take where that is less than its items ``N``: the service's reservoir bound)."""
    limit = np.asarray(N, dtype=float) if capacity is None else np.minimum(N, np.asarray(capacity, dtype=float))
    return np.maximum(limit - np.asarray(n, dtype=float), 0.0)


def _cap(alloc: np.ndarray, N, n, with_replacement: bool, shares=None, capacity=None) -> np.ndarray:
    """Without replacement, never more labels than a stratum's unlabelled items
    (of its `capacity`, the most labels it can take, where that is less than its
    items ``N``: the service's reservoir bound).

    Labels a full stratum cannot take go to the strata with room (in
    proportion to the method's own ``shares`` among them, else to their room),
    so a round is short only when every stratum is full.
    """
    alloc = np.asarray(alloc, dtype=np.int64)
    if with_replacement:
        return alloc
    shape = alloc.shape
    room = np.broadcast_to(room_left(N, n, capacity), shape).astype(np.int64)
    want = alloc.sum(axis=-1)
    out = np.minimum(alloc, room)
    w = None if shares is None else np.broadcast_to(np.asarray(shares, dtype=float), shape)
    for _ in range(shape[-1]):
        short = np.minimum(want - out.sum(axis=-1), (room - out).sum(axis=-1))
        if not np.any(short > 0):
            break
        free = (room - out) > 0
        weight = np.where(free, w if w is not None else 0.0, 0.0)
        weight = np.where(weight.sum(axis=-1, keepdims=True) > 0, weight, (room - out) * free)
        extra = largest_remainder(weight, np.maximum(short, 0))
        out = np.minimum(out + extra, room)
    return out


def pseudo_smoothed(n, h, q, weight: float = PSEUDO_WEIGHT) -> np.ndarray:
    """Stratum proportion from labels plus ``weight`` pseudo-observations at the
    calibrated mean score ``q_k`` (Druck & McCallum 2011, Sec. 5.1: sampled
    correctness values down-weighted to total ``weight``; with thousands of
    unlabelled items their weighted mean is ``q_k``)."""
    n = np.asarray(n, dtype=float)
    h = np.asarray(h, dtype=float)
    q = np.clip(np.asarray(q, dtype=float), 0.0, 1.0)
    return (h + weight * q) / (n + weight)


def neyman_shares(N, p, scale=None) -> np.ndarray:
    """Neyman (optimal) allocation shares ``N_k sigma_k / sum_j N_j sigma_j``
    (Kumar & Raj, Eq. 9), ``sigma_k = sqrt(p_k (1 - p_k))``.

    ``scale`` (per stratum, default 1) multiplies the shares: for a metric that
    is a non-linear function of the stratum proportions it is ``|dM/dp_k| / N_k``,
    so that the shares are Neyman's on the linearised variable
    (`confusion.allocation_scale`)."""
    p = np.asarray(p, dtype=float)
    shares = np.asarray(N, dtype=float) * np.sqrt(np.clip(p * (1 - p), 0.0, None))
    return shares if scale is None else shares * np.asarray(scale, dtype=float)


def allocate_opt(N, n, h, D, rng: np.random.Generator, with_replacement=True, scale=None) -> np.ndarray:
    """Bennett & Carvalho (2010, Fig. 1): ``Multinomial(D, N_k sigma_k)``."""
    shares = neyman_shares(N, bennett_smoothed(n, h), scale)
    return _cap(_multinomial(D, shares, N, rng), N, n, with_replacement, shares)


def allocate_opt_conf(N, n, h, q, D, rng: np.random.Generator, with_replacement=True, scale=None) -> np.ndarray:
    """Druck & McCallum (2011) "opt conf online": ``opt`` with sigma_k from
    labels mixed with score-based pseudo-observations (`pseudo_smoothed`)."""
    shares = neyman_shares(N, pseudo_smoothed(n, h, q), scale)
    return _cap(_multinomial(D, shares, N, rng), N, n, with_replacement, shares)


def allocate_opt_a2(N, n, h, D, round_index: int, n_ini: int = 5, with_replacement=True, scale=None) -> np.ndarray:
    """Kumar & Raj (Alg. 2, OPT-A2): round 0 labels ``n_ini`` per stratum; every
    later round splits ``D`` (their ``n_step``) by Neyman allocation on the
    plain unbiased sample variance ``s_k^2 = n_k/(n_k-1) p_k(1-p_k)`` (Eq. 3).

    A stratum whose labels all agree gets ``s_k = 0`` and no more labels; when
    every stratum is pure the round is split proportionally to ``N_k``.
    """
    if round_index == 0:
        return _initial_round(N, n, n_ini, with_replacement)
    shares = _sample_variance_shares(N, n, h, scale)
    return _cap(largest_remainder(shares, D), N, n, with_replacement, shares)


def allocate_opt_a1(N, n, first_n, first_h, D, round_index: int, n_ini: int = 5, with_replacement=True,
                    scale=None) -> np.ndarray:
    """Kumar & Raj (Alg. 1, OPT-A1): round 0 labels ``n_ini`` per stratum; all
    later labels follow Neyman allocation (Eq. 9) on the sample variances
    (Eq. 3) of those first labels alone (`first_n`, `first_h`: the labels and
    positives after round 0), never re-estimated.

    The paper spends a fixed budget ``n - K n_ini`` in one step; the online
    loop stops when the interval is narrow enough instead, so each round's
    ``D`` labels go where the cumulative labels beyond the first fall shortest
    of those frozen shares (the deficit rule of `allocate_opt_track`): after
    any number of rounds the allocation is the one OPT-A1 would have made for
    that budget, to within one label per stratum.
    """
    if round_index == 0:
        return _initial_round(N, n, n_ini, with_replacement)
    shares = _sample_variance_shares(N, first_n, first_h, scale)
    beyond = np.asarray(n, dtype=float) - np.asarray(first_n, dtype=float)
    return _cap(_track(shares, beyond, D), N, n, with_replacement, shares)


def _initial_round(N, n, n_ini: int, with_replacement: bool) -> np.ndarray:
    """OPT-A1/A2's round 0: ``n_ini`` per non-empty stratum (all of a smaller one)."""
    N = np.asarray(N, dtype=float)
    shape = np.broadcast_shapes(N.shape, np.shape(n))
    first = np.where(np.broadcast_to(N, shape) > 0, n_ini, 0).astype(np.int64)
    return first if with_replacement else np.minimum(first, np.maximum(N - n, 0).astype(np.int64))


def _sample_variance_shares(N, n, h, scale=None) -> np.ndarray:
    """Neyman shares ``N_k s_k`` on the plain unbiased sample variance
    ``s_k^2 = n_k/(n_k-1) p_k(1-p_k)`` (Kumar & Raj, Eq. 3 and 9); when every
    stratum's labels agree, ``N_k`` (proportional)."""
    N = np.asarray(N, dtype=float)
    n = np.asarray(n, dtype=float)
    shape = np.broadcast_shapes(N.shape, n.shape)
    p = np.asarray(h, dtype=float) / np.maximum(n, 1.0)
    s2 = np.where(n > 1, n / np.maximum(n - 1.0, 1.0), 0.0) * p * (1 - p)
    shares = np.broadcast_to(N * np.sqrt(s2) * (1.0 if scale is None else np.asarray(scale, dtype=float)), shape)
    pure = shares.sum(axis=-1, keepdims=True) <= 0
    return np.where(pure, np.broadcast_to(N, shape), shares)


def allocate_proportional(N, n, D, with_replacement=True) -> np.ndarray:
    """``pps``: cumulative labels track ``n_total * N_k / N`` (deficit rounding)."""
    shape = np.broadcast_shapes(np.shape(N), np.shape(n))
    shares = np.broadcast_to(np.asarray(N, float), shape)
    return _cap(_track(shares, n, D), N, n, with_replacement, shares)


def allocate_uniform(N, n, D, with_replacement=True) -> np.ndarray:
    """``uni``: cumulative labels track an equal split over the strata."""
    shape = np.broadcast_shapes(np.shape(N), np.shape(n))
    shares = np.where(np.broadcast_to(np.asarray(N), shape) > 0, 1.0, 0.0)
    return _cap(_track(shares, n, D), N, n, with_replacement, shares)


def allocate_opt_track(N, n, h, q, D, with_replacement=True, scale=None, capacity=None) -> np.ndarray:
    """stratameter's default: deterministic tracking of the estimated Neyman allocation.

    Two changes to ``opt``/``opt_conf``, each removing a source of waste or
    of dishonest intervals:
    * sigma_k comes from `pseudo_smoothed` (labels plus ``PSEUDO_WEIGHT``
      pseudo-observations at the calibrated score, Druck & McCallum 2011), so
      a stratum whose first labels all agree is not starved (the OPT-A2
      failure) and the allocation is sensible from the first round;
    * instead of a random multinomial draw per round, the round's labels go
      where the *cumulative* labels fall shortest of the Neyman target
      ``(n_total + D) * N_k sigma_k / sum_j N_j sigma_j`` (largest-remainder
      rounding of the deficits).  Early mis-allocations are repaid, so the
      cumulative allocation converges to Neyman's and the label count to the
      oracle's, with no extra randomness in n_k.
    Every stratum first gets ``MIN_LABELS_PER_STRATUM`` labels so that its
    variance can be estimated; the rest of that warm-up round (the round always
    has ``D`` labels) goes by the tracking rule.  Without replacement a stratum
    takes at most its `capacity` (default: its items; `_cap`).
    """
    N = np.asarray(N, dtype=float)
    n = np.asarray(n, dtype=float)
    shape = np.broadcast_shapes(N.shape, n.shape)
    need = np.where(np.broadcast_to(N, shape) > 0, np.maximum(MIN_LABELS_PER_STRATUM - n, 0.0), 0.0)
    warm = largest_remainder(need, np.minimum(need.sum(axis=-1), D).astype(np.int64))
    shares = np.broadcast_to(neyman_shares(N, half_label_smoothed(n, h), scale), shape)
    rest = D - warm.sum(axis=-1)
    alloc = warm + _track(shares, n + warm, rest)
    return _cap(alloc, N, n, with_replacement, shares, capacity)


def _track(shares: np.ndarray, n, D) -> np.ndarray:
    """Split ``D`` (per row) so cumulative counts move toward ``(sum n + D) * share``.

    Rows whose shares are all zero (every non-empty stratum pure, or no
    non-empty stratum known) fall back to an even split over the strata with a
    non-zero share if any, else over all strata.
    """
    shares = np.asarray(shares, dtype=float)
    n = np.asarray(n, dtype=float)
    D = np.broadcast_to(np.asarray(D), np.broadcast_shapes(shares.shape, n.shape)[:-1])
    s = shares.sum(axis=-1, keepdims=True)
    frac = shares / np.where(s > 0, s, 1.0)
    target = (n.sum(axis=-1, keepdims=True) + D[..., None]) * frac
    deficit = np.maximum(target - n, 0.0)
    return largest_remainder(np.where(deficit.sum(axis=-1, keepdims=True) > 0, deficit, frac), D)


def _multinomial(D, shares: np.ndarray, N, rng: np.random.Generator) -> np.ndarray:
    """``Multinomial(D, shares)``; all-zero shares (every stratum pure) fall
    back to ``N_k``, never to a stratum with no items."""
    shares = np.asarray(shares, dtype=float)
    s = shares.sum(axis=-1, keepdims=True)
    size = np.broadcast_to(np.asarray(N, dtype=float), shares.shape)
    p = np.where(s > 0, shares, size)
    p = p / p.sum(axis=-1, keepdims=True)
    return rng.multinomial(D, p).astype(np.int64)


def allocate(
    method: str,
    *,
    N,
    n,
    h,
    q=None,
    D: int,
    round_index: int,
    rng: np.random.Generator,
    with_replacement: bool = True,
    n_ini: int = 5,
    scale=None,
    first=None,
) -> np.ndarray:
    """Labels per stratum for the next round of `method` (see module docstring).

    ``scale`` (per stratum) weights the variance-driven methods' Neyman shares
    (see `neyman_shares`); the proportional and uniform methods ignore it.
    ``first`` is ``(n, h)`` after round 0, which ``opt_a1`` needs from round 1 on."""
    N = np.asarray(N)
    if D < 1:
        raise ValueError(f"round size must be >= 1, got {D!r}")
    if method in ("opt_conf", "opt_track") and q is None:
        raise ValueError(f"allocation {method!r} needs the calibrated mean score per stratum (q)")
    if method == "opt_track":
        return allocate_opt_track(N, n, h, q, D, with_replacement, scale)
    if method == "opt":
        return allocate_opt(N, n, h, D, rng, with_replacement, scale)
    if method == "opt_conf":
        return allocate_opt_conf(N, n, h, q, D, rng, with_replacement, scale)
    if method == "opt_a2":
        return allocate_opt_a2(N, n, h, D, round_index, n_ini, with_replacement, scale)
    if method == "opt_a1":
        if round_index > 0 and first is None:
            raise ValueError("allocation 'opt_a1' needs the labels after round 0 (first=(n, h)) from round 1 on")
        first_n, first_h = (n, h) if first is None else first
        return allocate_opt_a1(N, n, first_n, first_h, D, round_index, n_ini, with_replacement, scale)
    if method in ("pps", "random"):
        return allocate_proportional(N, n, D, with_replacement)
    if method == "uni":
        return allocate_uniform(N, n, D, with_replacement)
    raise ValueError(f"allocation must be one of {ALLOCATIONS}, got {method!r}")
