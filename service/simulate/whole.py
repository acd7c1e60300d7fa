"""The online stratified loop on the whole stream, for recall, F1 and accuracy.

As `engine` does for precision, one call simulates R runs of one design on one
population, vectorised over runs: strata on the predicted positives (ids
0..K-1, as today) and on the predicted negatives (after them), rounds
allocated by the core's `allocation` with the linearised-variable scale of
`confusion.allocation_scale`, labels drawn from the true stratum composition,
and the T-round stopping rule applied to the widest interval of the enabled
metrics.

Rounds: Bennett & Carvalho's 2 labels per stratum, or 1 % of the labels so
far when that is more (`ROUND_GROWTH`).  Rare positives make random sampling
need 10^4-10^5 labels for a recall; rounds of a fixed 2K labels would take
tens of thousands of steps, and 1 % growth overshoots the stopping point by
at most about 2 % of the labels, for every design alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..stats import allocation, confusion, stopping
from ..stats.calibration import resolve_kind, stratum_mean_probability, to_probability
from ..stats.sketch import ScoreHistogram
from ..stats.strata import assign, boundaries
from .engine import Protocol, _draw
from .whole_populations import WholeStream

#: A round is at least this share of the labels so far (see the module docstring).
ROUND_GROWTH = 0.01
#: Label cap of a run, as a multiple of the labels random sampling of the whole
#: stream needs for a proportion of 1/2 at ``delta``, times ``1 / prevalence``
#: (recall sees only the truly positive items).
MAX_LABELS_FACTOR = 3.0


@dataclass(frozen=True)
class WholeDesign:
    """Allocation and stratification on each side of the threshold."""

    method: str = allocation.DEFAULT_ALLOCATION
    stratification: str = "perc"
    strata: int = 4
    negative_stratification: str = confusion.DEFAULT_NEGATIVE_STRATIFICATION
    negative_strata: int = 4
    #: Kumar & Raj's strata for the accuracy of two-sided scores: `strata` strata on
    #: |score - threshold| pooled across both sides (`margin_strata`), accuracy only
    margin: bool = False

    @property
    def label(self) -> str:
        if self.method == "random":
            return "random"
        if self.margin:
            return f"{self.method}/{self.stratification} on |margin|"
        return f"{self.method}/{self.stratification}+{self.negative_stratification}"


@dataclass(frozen=True)
class WholeTruth:
    """A population cut into a design's strata on both sides."""

    N: np.ndarray
    G: np.ndarray
    q: np.ndarray
    positive: np.ndarray  # bool per stratum

    @property
    def P(self) -> np.ndarray:
        return self.G / self.N


def _side(scores: np.ndarray, labels: np.ndarray, k: int, method: str):
    """``(N, G, q)`` of one side cut into (at most) `k` strata, empty strata dropped."""
    if scores.size == 0:
        return np.zeros(0), np.zeros(0), np.zeros(0)
    hist = ScoreHistogram.from_scores(scores)
    cuts = boundaries(hist, k, method)
    stratum = assign(scores, cuts)
    N = np.bincount(stratum, minlength=cuts.size + 1)
    G = np.bincount(stratum, weights=labels, minlength=cuts.size + 1)
    keep = N > 0
    return N[keep], G[keep], stratum_mean_probability(hist, cuts)[keep]


def prepare_whole(pop: WholeStream, design: WholeDesign, metrics) -> WholeTruth:
    """Stratify both sides the way the service would (histogram -> boundaries per side).

    Random sampling of the whole stream is one stratum per side with
    proportional allocation: the sample's sides are known, so this is simple
    random sampling post-stratified on the (known) side sizes.
    """
    if design.margin:
        return margin_strata(pop, design.strata, design.stratification)
    random = design.method == "random"
    pred = pop.predicted_positive
    labels = pop.labels.astype(float)
    k_pos = 1 if random else design.strata
    k_neg = 0 if not confusion.needs_negatives(metrics) else (1 if random else design.negative_strata)
    pos = _side(pop.scores[pred], labels[pred], k_pos, design.stratification)
    neg = _side(pop.scores[~pred], labels[~pred], k_neg, design.negative_stratification) if k_neg else (
        np.zeros(0), np.zeros(0), np.zeros(0))
    N, G, q = (np.concatenate([a, b]) for a, b in zip(pos, neg))
    positive = np.concatenate([np.ones(pos[0].size, bool), np.zeros(neg[0].size, bool)])
    return WholeTruth(N.astype(np.int64), G.astype(np.int64), q, positive)


#: Items per stratum of the floor the design is measured against (`fine_strata`, issue 51).
FLOOR_STRATUM_ITEMS = 500


def fine_strata(pop: WholeStream, items: int = FLOOR_STRATUM_ITEMS) -> WholeTruth:
    """Each side cut into strata of `items` consecutive items by score (the last one smaller):
    with the true proportions, the Neyman bound on these strata (`whole_study.oracle_labels`) is
    the floor no stratification of the score can go far under (Cochran 1977, Sec. 5A.7: the
    gain of finer strata vanishes as they grow many), the limit inclusion by a right prior
    reaches too (Zrnic & Candes 2024)."""
    pred, labels = pop.predicted_positive, pop.labels.astype(float)
    parts = []
    for side, positive in ((pred, True), (~pred, False)):
        if not side.any():
            continue
        order = np.argsort(pop.scores[side], kind="stable")
        stratum = np.empty(order.size, dtype=np.int64)
        stratum[order] = np.arange(order.size) // items
        N = np.bincount(stratum)
        G = np.bincount(stratum, weights=labels[side])
        parts.append((N, G, np.full(N.size, positive)))
    N, G, positive = (np.concatenate(a) for a in zip(*parts))
    return WholeTruth(N.astype(np.int64), G.astype(np.int64), G / N, positive)


def margin_strata(pop: WholeStream, k: int, method: str) -> WholeTruth:
    """Kumar & Raj (Sec. 3.3): for the accuracy of a classifier with two-sided scores,
    strata on z = |score - threshold| across both sides, the variable being "the
    prediction was right".  Every stratum is marked positive, so the confusion code's
    accuracy (``TP / N`` with no negative stratum) is the stratified mean of that
    variable.  The prior ``q`` per stratum is the mean calibrated chance of being right
    (``p`` above the threshold, ``1 - p`` below).

    Each of these strata is the union of a positive-side and a negative-side stratum of
    the two-sided design; splitting a stratum never increases the variance under
    proportional allocation, which is why the service keeps the sides apart (and
    needs them apart for recall and F1)."""
    pred = pop.predicted_positive
    z = np.abs(pop.scores - pop.threshold)
    right = (pop.labels.astype(bool) == pred).astype(float)
    stratum = assign(z, boundaries(ScoreHistogram.from_scores(z), k, method))
    p = to_probability(pop.scores, resolve_kind("auto", float(pop.scores.min()), float(pop.scores.max())))
    N = np.bincount(stratum)
    G = np.bincount(stratum, weights=right, minlength=N.size)
    chance = np.bincount(stratum, weights=np.where(pred, p, 1.0 - p), minlength=N.size)
    keep = N > 0
    q = chance[keep] / N[keep]
    return WholeTruth(N[keep].astype(np.int64), G[keep].astype(np.int64), q, np.ones(int(keep.sum()), bool))


def max_labels(pop: WholeStream, protocol: Protocol) -> int:
    """The label cap of a run (`MAX_LABELS_FACTOR`)."""
    return int(protocol.max_labels / max(min(pop.prevalence, 0.5) * 2.0, 1e-3)) + 1


@dataclass
class WholeResult:
    """Per run: labels at stop, and per metric the estimate and interval."""

    labels: np.ndarray
    estimate: dict[str, np.ndarray]
    lower: dict[str, np.ndarray]
    upper: dict[str, np.ndarray]
    stopped: np.ndarray


def run_whole_until_stop(st: WholeTruth, design: WholeDesign, metrics, protocol: Protocol, runs: int, seed,
                         cap: int) -> WholeResult:
    """R runs of the online loop until every metric's half-width is <= delta for T rounds."""
    rng = np.random.default_rng(seed)
    k = st.N.size
    fpc = not protocol.with_replacement
    n = np.zeros((runs, k), dtype=np.int64)
    h = np.zeros((runs, k), dtype=np.int64)
    first_n, first_h = n.copy(), h.copy()  # the labels after round 0 (OPT-A1 allocates by them)
    streak = np.zeros(runs, dtype=np.int64)
    out = WholeResult(np.full(runs, np.nan), *({m: np.full(runs, np.nan) for m in metrics} for _ in range(3)),
                      np.zeros(runs, bool))
    var = [np.full(runs, np.inf) for _ in metrics]
    active = np.arange(runs)
    r = 0
    while active.size:
        na, ha = n[active], h[active]
        D = max(allocation.round_size(k, protocol.labels_per_stratum), int(ROUND_GROWTH * na[0].sum()))
        scale = confusion.allocation_scale(metrics, st.N, na, ha, st.positive, [v[active] for v in var])
        alloc = allocation.allocate(design.method, N=st.N, n=na, h=ha, q=st.q, D=D, round_index=r, rng=rng,
                                    with_replacement=protocol.with_replacement, scale=scale,
                                    first=(first_n[active], first_h[active]))
        ha = ha + _draw(alloc, na, ha, st, rng, protocol.with_replacement)
        na = na + alloc
        n[active], h[active] = na, ha
        if r == 0:
            first_n[active], first_h[active] = na, ha
        ivs = {m: confusion.metric_interval(m, st.N, na, ha, st.positive, protocol.confidence, fpc) for m in metrics}
        for v, m in zip(var, metrics):
            v[active] = ivs[m].stderr ** 2
        widest = np.max([np.where(np.isfinite(iv.halfwidth), iv.halfwidth, np.inf) for iv in ivs.values()], axis=0)
        streak[active] = stopping.next_streak(streak[active], widest, protocol.delta)
        done = stopping.should_stop(streak[active], protocol.rounds)
        finish = done | (na.sum(axis=1) >= cap) | (alloc.sum(axis=1) == 0)
        if finish.any():
            idx = active[finish]
            out.labels[idx] = na[finish].sum(axis=1)
            for m, iv in ivs.items():
                out.estimate[m][idx] = reported(m, iv, design, st, na, ha, done)[finish]
                out.lower[m][idx], out.upper[m][idx] = iv.lower[finish], iv.upper[finish]
            out.stopped[idx] = done[finish]
            active = active[~finish]
        r += 1
    return out


def reported(metric: str, iv, design: WholeDesign, st: WholeTruth, n, h, stopped) -> np.ndarray:
    """The estimate a run reports (as `engine.reported`): random's plain plug-in, a stratified
    design's `Interval.estimate`, with the stopping rule's term where it `stopped` by the rule."""
    if design.method == "random":
        return confusion.plug_in(metric, st.N, n, h, st.positive)
    return iv.reading(stopped)


def run_whole_budget(st: WholeTruth, design: WholeDesign, metrics, budgets, runs: int, seed,
                     confidence: float = 0.95, labels_per_stratum: int = 2) -> WholeResult:
    """R runs of the loop with no stopping rule (with replacement), observed at each of `budgets`
    (sorted): the last round before a budget is cut so that every run has exactly its labels, as
    `engine.run_budget`.  The result's arrays are (budgets, runs); ``labels`` holds the budgets."""
    rng = np.random.default_rng(seed)
    k = st.N.size
    n = np.zeros((runs, k), dtype=np.int64)
    h = np.zeros((runs, k), dtype=np.int64)
    shape = (len(budgets), runs)
    out = WholeResult(np.asarray(budgets, dtype=float), *({m: np.full(shape, np.nan) for m in metrics}
                                                          for _ in range(3)), np.zeros(runs, bool))
    var = [np.full(runs, np.inf) for _ in metrics]
    used, r = 0, 0
    for b, budget in enumerate(budgets):
        while used < budget:
            D = max(allocation.round_size(k, labels_per_stratum), int(ROUND_GROWTH * used))
            D = int(min(D, budget - used))
            scale = confusion.allocation_scale(metrics, st.N, n, h, st.positive, var)
            alloc = allocation.allocate(design.method, N=st.N, n=n, h=h, q=st.q, D=D, round_index=r, rng=rng,
                                        scale=scale)
            h += _draw(alloc, n, h, st, rng, True)
            n += alloc
            used, r = used + D, r + 1
            ivs = {m: confusion.metric_interval(m, st.N, n, h, st.positive, confidence, False) for m in metrics}
            var = [ivs[m].stderr ** 2 for m in metrics]
        for m, iv in ivs.items():
            out.estimate[m][b] = reported(m, iv, design, st, n, h, False)
            out.lower[m][b], out.upper[m][b] = iv.lower, iv.upper
    return out
