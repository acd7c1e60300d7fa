"""`stratameter simulate --fleet FILE`: several classifiers, one review team's hourly budget.

Each classifier of the fleet (`fleet_spec`) has an hourly chunk of ``items_per_hour`` items cut
into the service's strata (its built-in population's, scaled to the chunk: its predicted positives
for precision, both sides of its threshold for recall, F1 or accuracy, `fleet_chunks`), sampled
without replacement by the service's allocation (``opt_track``) and read with its interval (with the
finite population correction; the widest of its metrics' is the half-width).  Every step of the hour (`STEP_SECONDS`,
answers come back within the step) the labels the paced budget allows so far
(`lifecycle.budget_allowance`) are given out one of three ways:

* ``shared``: one budget for the fleet, the next labels where they lower the largest weighted
  ratio of half-width to delta (`stats.fleet.share_budget`);
* ``asks``: the same budget as the service spends it (`chunks.group_plan`): no allocation for the
  whole fleet, but each classifier in turn, in an order drawn every step, asks for its own share of
  what is left, over the forecasts as they stand (those that asked before it counting their grant
  as requests out), and takes at most its round;
* ``equal``: the same budget split equally, each classifier its own hourly budget (today's
  ``MAX_LABELS_PER_HOUR`` set by hand to budget / classifiers);
* ``volume``: split in proportion to the classifiers' items.

In all four a classifier first takes its warm-up round (two labels a stratum), then rounds sized
on the same forecast (`stats.fleet.labels_to_halfwidth`: what it needs to reach its delta, or the
shared level), at most `streams.SHORTFALL_GROWTH` times the labels it has; once within its delta it
takes rounds of two labels a stratum until `stopping.DEFAULT_ROUNDS` of them agree (Bennett &
Carvalho's rule, as the service), and then nothing more.  The chunks of
the fleet's hours are drawn afresh, the hour's budget is not carried over."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..chunks.lifecycle import budget_allowance
from ..stats import allocation, stopping
from ..stats.fleet import Forecast, halfwidth_after, labels_to_halfwidth, share_budget
from ..stats.streams import SHORTFALL_GROWTH
from .fleet_chunks import ChunkTruth, allocate, read
from .fleet_spec import FleetSpec, Member

STRATEGIES = ("shared", "asks", "equal", "volume")
#: Seconds between two rounds of the fleet (the request loop steps every few seconds; answers that
#: come back within a minute make one round a minute).
STEP_SECONDS = 60.0


@dataclass
class HourResult:
    """Per run and classifier (last axis), at the end of the hour."""

    labels: np.ndarray
    halfwidth: np.ndarray
    estimate: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    converged: np.ndarray
    truth: np.ndarray  # (C,)
    ratio: np.ndarray  # weighted half-width over delta (inf where there is no interval)

    def covered(self) -> np.ndarray:
        return (self.lower <= self.truth) & (self.truth <= self.upper)


def own_budgets(members: tuple[Member, ...], budget: int, strategy: str) -> np.ndarray:
    """Each classifier's hourly budget under a split (`equal`, `volume`), summing to `budget`."""
    if strategy == "equal":
        shares = np.ones(len(members))
    elif strategy == "volume":
        shares = np.array([float(m.items_per_hour) for m in members])
    else:
        raise ValueError(f"a split strategy is equal or volume, got {strategy!r}")
    return allocation.largest_remainder(shares, budget)


class _Fleet:
    """The state of `runs` runs of the fleet's classifiers through one hour."""

    def __init__(self, spec: FleetSpec, truths: list[ChunkTruth], runs: int, confidence: float):
        self.members, self.truths, self.runs, self.confidence = spec.members, truths, runs, confidence
        self.n = [np.zeros((runs, t.N.size), np.int64) for t in truths]
        self.h = [np.zeros((runs, t.N.size), np.int64) for t in truths]
        C = len(truths)
        self.streak = np.zeros((runs, C), np.int64)
        self.iv = [read(t, self.n[c], self.h[c], confidence) for c, t in enumerate(truths)]
        self.delta = np.array([m.delta for m in spec.members])
        self.weight = np.array([m.weight for m in spec.members])
        self.items = np.array([float(t.N.sum()) for t in truths])
        self.warm_up = np.array([allocation.round_size(t.N.size) for t in truths])

    def labels(self) -> np.ndarray:
        return np.stack([n.sum(axis=1) for n in self.n], axis=1)

    def halfwidth(self) -> np.ndarray:
        return np.stack([iv.halfwidth for iv in self.iv], axis=1)

    def forecast(self, give: np.ndarray) -> Forecast:
        """The classifiers as the allocation sees them; none that stopped, nor one in a fixed round."""
        done = stopping.should_stop(self.streak)
        room = np.where(done | (give > 0), 0.0, self.items - self.labels())
        hw = np.where(give > 0, np.inf, self.halfwidth())
        n = np.maximum(self.labels(), 1)
        return Forecast(hw, n, np.broadcast_to(self.items, hw.shape), np.broadcast_to(self.delta, hw.shape),
                        room, np.broadcast_to(self.weight, hw.shape))

    def round_cap(self) -> np.ndarray:
        return np.maximum(self.warm_up, SHORTFALL_GROWTH * self.labels())

    def label(self, give: np.ndarray, rng: np.random.Generator) -> None:
        """Each classifier's `give` labels by its own allocation, drawn without replacement."""
        for c, t in enumerate(self.truths):
            if not give[:, c].any():
                continue
            n, h = self.n[c], self.h[c]
            alloc = allocate(t, n, h, give[:, c], self.iv[c])
            hit = rng.hypergeometric(t.G - h, (t.N - t.G) - (n - h), alloc)
            self.n[c], self.h[c] = n + alloc, h + hit
            iv = read(t, self.n[c], self.h[c], self.confidence)
            moved = give[:, c] > 0
            self.streak[:, c] = np.where(moved, stopping.next_streak(self.streak[:, c], iv.halfwidth, float(self.delta[c])),
                                         self.streak[:, c])
            self.iv[c] = iv

    def result(self) -> HourResult:
        stack = lambda field: np.stack([getattr(iv, field) for iv in self.iv], axis=1)  # noqa: E731
        hw = self.halfwidth()
        return HourResult(self.labels(), hw, stack("estimate"), stack("lower"), stack("upper"),
                          stopping.should_stop(self.streak), np.array([t.truth for t in self.truths]),
                          self.weight * hw / self.delta)


def _fixed_rounds(fleet: _Fleet, left: np.ndarray) -> np.ndarray:
    """The rounds of two labels a stratum the budget allows, in the fleet's order: a classifier's
    warm-up, and the rounds that confirm a half-width within delta (the stopping rule's T rounds).
    `left`: the shared budget per run, or each classifier's; reduced in place."""
    give = np.zeros((fleet.runs, len(fleet.truths)), np.int64)
    due = (fleet.labels() == 0) | ((fleet.streak > 0) & ~stopping.should_stop(fleet.streak))
    for c in range(len(fleet.truths)):
        pool = left if left.ndim == 1 else left[:, c]
        ok = due[:, c] & (pool >= fleet.warm_up[c])
        pool -= np.where(ok, fleet.warm_up[c], 0)
        give[:, c] = np.where(ok, fleet.warm_up[c], 0)
    return give


def _asks(f: Forecast, left: np.ndarray, cap: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The ``asks`` strategy's labels this step (module docstring): each classifier, in an order
    drawn now, its share of the `left` per run (`share_budget` over `f` as it stands, the grants
    before it this step counted as its labels), at most its round `cap`."""
    more = np.zeros(np.shape(f.halfwidth), np.int64)
    left = left.copy()
    for c in rng.permutation(more.shape[1]):
        now = Forecast(halfwidth_after(f, more), f.labels + more, f.items, f.delta,
                       np.maximum(np.asarray(f.room) - more, 0.0), f.weight)
        ask = np.minimum(share_budget(now, left)[:, c], cap[:, c]).astype(np.int64)
        more[:, c] = ask
        left -= ask
    return more


def run_hour(spec: FleetSpec, truths: list[ChunkTruth], budget: int, strategy: str, runs: int,
             rng: np.random.Generator, confidence: float = 0.95) -> HourResult:
    """`runs` runs of one hour of the fleet under `strategy` (module docstring)."""
    fleet = _Fleet(spec, truths, runs, confidence)
    own = None if strategy in ("shared", "asks") else own_budgets(spec.members, budget, strategy)
    for step in range(int(3600 // STEP_SECONDS)):
        seconds = step * STEP_SECONDS
        if own is None:
            left = int(budget_allowance(budget, seconds)) - fleet.labels().sum(axis=1)
        else:
            left = budget_allowance(own, seconds)[None, :] - fleet.labels()
        left = np.maximum(left, 0).astype(np.int64)
        give = _fixed_rounds(fleet, left)
        f = fleet.forecast(give)
        if strategy == "asks":
            more = _asks(f, left, fleet.round_cap(), rng)
        elif own is None:
            more = share_budget(f, left)
        else:
            need = np.where(np.isfinite(f.halfwidth), np.minimum(labels_to_halfwidth(f, f.delta), f.room), 0.0)
            more = np.minimum(np.ceil(need), left)
        give = give + np.minimum(more, fleet.round_cap()).astype(np.int64)
        fleet.label(give, rng)
    return fleet.result()
