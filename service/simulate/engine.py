"""Bennett & Carvalho's evaluation protocol, vectorised over independent runs.

One call simulates R runs of one design (allocation x stratification) on one
population: every run draws its round's allocation with the same core code the
service uses (`stratameter.stats`), labels are drawn from the population's true
stratum composition (binomial with replacement, hypergeometric without), and
the run stops by the T-round rule.  Arrays are (runs, strata), so a thousand
runs cost about as much as one round loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..stats import allocation, estimator, oracle, stopping
from ..stats.calibration import stratum_mean_probability
from ..stats.sketch import ScoreHistogram
from ..stats.strata import assign, boundaries
from .populations import Population


@dataclass(frozen=True)
class Design:
    """What a run does: an allocation method on a stratification of K strata."""

    method: str = allocation.DEFAULT_ALLOCATION
    stratification: str = "perc"
    strata: int = 4
    interval: str = "wilson"

    @property
    def effective_strata(self) -> int:
        return 1 if self.method == "random" else self.strata

    @property
    def label(self) -> str:
        return "random" if self.method == "random" else f"{self.method}/{self.stratification}"


@dataclass(frozen=True)
class Protocol:
    """Stopping target and round sizes (Bennett & Carvalho 2010, Sec. 6)."""

    delta: float = 0.01
    confidence: float = 0.95
    rounds: int = stopping.DEFAULT_ROUNDS
    labels_per_stratum: int = 2
    with_replacement: bool = True
    max_labels_factor: float = 3.0  # x the worst-case random-sampling sample size

    @property
    def max_labels(self) -> int:
        z = estimator.z_value(self.confidence)
        return int(self.max_labels_factor * z * z * 0.25 / self.delta**2) + 1


@dataclass(frozen=True)
class StrataTruth:
    """A population cut into a design's strata: the simulator's ground truth."""

    cuts: np.ndarray
    N: np.ndarray  # items per stratum
    G: np.ndarray  # true positives per stratum
    q: np.ndarray  # mean calibrated score per stratum (opt_conf/opt_track prior)
    truth: float

    @property
    def P(self) -> np.ndarray:
        return self.G / self.N

    def oracle_labels(self, delta: float, confidence: float, fpc: bool = False) -> float:
        return oracle.neyman_oracle_labels(self.N, self.P, delta, confidence, fpc)

    def jeffreys_oracle_labels(self, delta: float, confidence: float, fpc: bool = False) -> float:
        return oracle.jeffreys_oracle_labels(self.N, self.P, delta, confidence, fpc)


def prepare(pop: Population, design: Design) -> StrataTruth:
    """Stratify `pop` the way the service would (histogram -> boundaries)."""
    hist = ScoreHistogram.from_scores(pop.scores)
    cuts = boundaries(hist, design.effective_strata, design.stratification)
    stratum = assign(pop.scores, cuts)
    k = cuts.size + 1
    N = np.bincount(stratum, minlength=k).astype(np.int64)
    G = np.bincount(stratum, weights=pop.labels, minlength=k).astype(np.int64)
    keep = N > 0  # the histogram's interpolation can leave a sliver stratum empty
    q = stratum_mean_probability(hist, cuts)[keep]
    return StrataTruth(cuts, N[keep], G[keep], q, pop.truth)


def _draw(alloc, n, h, st: StrataTruth, rng, with_replacement: bool) -> np.ndarray:
    """Positives among `alloc` new labels per stratum."""
    if with_replacement:
        return rng.binomial(alloc, st.P)
    good = st.G - h
    bad = (st.N - st.G) - (n - h)
    return rng.hypergeometric(good, bad, alloc)


def reported(iv: estimator.Interval, design: Design, N, n, h, stopped) -> np.ndarray:
    """The estimate a run reports: for `random`, the plain sample proportion of its simple random
    sample (the honest baseline); for a stratified design, `estimator.Interval.estimate`, with the
    stopping rule's term where the run `stopped` by the rule (`Interval.reading`)."""
    if design.method == "random":
        return estimator.stratified_estimate(N, n, h)
    return iv.reading(stopped)


@dataclass
class StopResult:
    """Per run: labels used, the estimate and interval when it stopped."""

    labels: np.ndarray
    estimate: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    stopped: np.ndarray  # False where the run hit the label cap


def run_until_stop(st: StrataTruth, design: Design, protocol: Protocol, runs: int, seed) -> StopResult:
    """R runs of the online loop, each until its T-round stopping rule holds."""
    rng = np.random.default_rng(seed)
    k = st.N.size
    D = allocation.round_size(k, protocol.labels_per_stratum)
    n = np.zeros((runs, k), dtype=np.int64)
    h = np.zeros((runs, k), dtype=np.int64)
    first_n, first_h = n.copy(), h.copy()  # the labels after round 0 (OPT-A1 allocates by them)
    streak = np.zeros(runs, dtype=np.int64)
    out = StopResult(*(np.full(runs, np.nan) for _ in range(4)), np.zeros(runs, bool))
    active = np.arange(runs)
    cap = protocol.max_labels if protocol.with_replacement else min(protocol.max_labels, int(st.N.sum()))
    r = 0
    while active.size:
        na, ha = n[active], h[active]
        alloc = allocation.allocate(
            design.method, N=st.N, n=na, h=ha, q=st.q, D=D, round_index=r, rng=rng,
            with_replacement=protocol.with_replacement, first=(first_n[active], first_h[active]),
        )
        hit = _draw(alloc, na, ha, st, rng, protocol.with_replacement)
        na, ha = na + alloc, ha + hit
        n[active], h[active] = na, ha
        if r == 0:
            first_n[active], first_h[active] = na, ha
        iv = estimator.interval(st.N, na, ha, protocol.confidence, design.interval,
                                fpc=not protocol.with_replacement)
        streak[active] = stopping.next_streak(streak[active], iv.halfwidth, protocol.delta)
        done = stopping.should_stop(streak[active], protocol.rounds)
        # a round that gives no labels (without replacement: every item is
        # labelled) cannot change the interval: the run stops as exhausted
        exhausted = (na.sum(axis=1) >= cap) | (alloc.sum(axis=1) == 0)
        finish = done | exhausted
        if finish.any():
            idx = active[finish]
            out.labels[idx] = na[finish].sum(axis=1)
            out.estimate[idx] = reported(iv, design, st.N, na, ha, done)[finish]
            out.lower[idx], out.upper[idx] = iv.lower[finish], iv.upper[finish]
            out.stopped[idx] = done[finish]
            active = active[~finish]
        r += 1
    return out


@dataclass
class BudgetResult:
    """Estimates and intervals of every run at each fixed label budget."""

    budgets: np.ndarray  # (B,)
    estimate: np.ndarray  # (B, runs)
    lower: np.ndarray
    upper: np.ndarray


def run_budget(st: StrataTruth, design: Design, budgets, runs: int, seed, confidence: float = 0.95,
               with_replacement: bool = True, labels_per_stratum: int = 2) -> BudgetResult:
    """R runs of the online loop with no stopping rule, observed at each budget.

    The last round before a budget is truncated so every run has exactly the
    budget's label count (Kumar & Raj's fixed-n comparison).  Without
    replacement a budget above the population size cannot be reached: once a
    round gives no labels (everything is labelled) the remaining budgets are
    observed at the final, complete state.
    """
    budgets = np.asarray(sorted(set(int(b) for b in budgets)))
    if budgets.size == 0 or budgets[0] < 1:
        raise ValueError("budgets must be positive label counts")
    rng = np.random.default_rng(seed)
    k = st.N.size
    D = allocation.round_size(k, labels_per_stratum)
    n = np.zeros((runs, k), dtype=np.int64)
    h = np.zeros((runs, k), dtype=np.int64)
    shape = (budgets.size, runs)
    res = BudgetResult(budgets, np.full(shape, np.nan), np.full(shape, np.nan), np.full(shape, np.nan))
    used, r, b, first = 0, 0, 0, None
    while b < budgets.size:
        step = int(min(D, budgets[b] - used))
        alloc = allocation.allocate(design.method, N=st.N, n=n, h=h, q=st.q, D=step, round_index=r,
                                    rng=rng, with_replacement=with_replacement, first=first)
        if design.method in ("opt_a1", "opt_a2") and r == 0:
            step = int(alloc[0].sum())  # OPT-A1/A2's initial round is n_ini per stratum
        h += _draw(alloc, n, h, st, rng, with_replacement)
        n += alloc
        if r == 0:
            first = (n.copy(), h.copy())
        used += step
        r += 1
        if not alloc.any():
            used = int(budgets[-1])  # exhausted: nothing more to label
        while b < budgets.size and used >= budgets[b]:
            if design.method == "random" and design.interval == "wilson":  # n fixed in advance: no adaptive term
                iv = estimator.wilson_interval(st.N, n, h, confidence, not with_replacement, adaptive=False)
            else:
                iv = estimator.interval(st.N, n, h, confidence, design.interval, fpc=not with_replacement)
            res.estimate[b], res.lower[b], res.upper[b] = reported(iv, design, st.N, n, h, False), iv.lower, iv.upper
            b += 1
    return res
