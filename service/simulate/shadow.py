"""`stratameter simulate --shadow POP`: a model and its shadow scoring the same items, each
estimating its own precision to its delta; how many label requests the pair needs when an item
wanted by both is requested once.

The items are a chunk of `CHUNK_ITEMS` of the whole-stream population `POP` (its labels and its
scores: the model's).  The shadow scores the same items with the model's margin plus Gaussian
noise (`NOISE`, logit scale: a retrained model that agrees with the first on most items), and both
decide at the population's threshold (on raw margins the noise is added to the score itself).  Each classifier samples its own predicted positives as the
service does: its ``perc`` strata, the default allocation in rounds of two labels a stratum until its
stopping rule holds, and inside a stratum threshold sampling, its sample being the items of the
lowest priorities.  With **independent** priorities (today: a random number per classifier) the
pair's requests are nearly the sum of both.  With **shared** priorities (the item's priority a hash
of its ``item_id``, the same for both) an item in both samples is requested once, and the samples
overlap as much as the two classifiers' thresholds allow.  Each classifier's design, labels and
interval are the same either way: only the requests they share change."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import expit, logit

from ..stats import allocation, estimator, stopping
from ..stats.strata import assign
from . import engine
from .populations import Population
from .whole_populations import WholeStream

#: Items of the chunk the pair scores.
CHUNK_ITEMS = 20_000
#: Standard deviation of the noise on the shadow's margin (logit of the model's score).
NOISE = 0.5
#: Runs simulated at once (item-level arrays of runs x items).
BLOCK = 100


@dataclass(frozen=True)
class Side:
    """One classifier's strata over the chunk's items: each item's stratum (-1: predicted negative)."""

    stratum: np.ndarray
    N: np.ndarray
    G: np.ndarray
    q: np.ndarray

    @property
    def truth(self) -> float:
        return float(self.G.sum() / self.N.sum())


def side(scores: np.ndarray, y: np.ndarray, threshold: float) -> Side:
    """The strata the service would cut on the predicted positives' scores (`engine.prepare`, the
    default design), and each item's among the strata that hold items."""
    pred = scores >= threshold
    st = engine.prepare(Population("side", scores[pred], y[pred]), engine.Design())
    full = assign(scores, st.cuts)
    held = np.unique(full[pred])  # `prepare` drops a stratum the histogram left empty
    return Side(np.where(pred, np.searchsorted(held, full), -1), st.N, st.G, st.q)


def pair(pop: WholeStream, seed: int, noise: float = NOISE) -> tuple[Side, Side, np.ndarray]:
    """The model's and the shadow's strata over one chunk of `pop`, and the items' labels."""
    rng = np.random.default_rng([seed, 7])
    pick = rng.choice(pop.size, CHUNK_ITEMS, replace=False)
    s, y = pop.scores[pick], pop.labels[pick].astype(np.int64)
    jitter = rng.normal(0.0, noise, s.size)
    if s.min() >= 0.0 and s.max() <= 1.0:  # probabilities: the noise is on their margin
        shadow = expit(logit(np.clip(s, 1e-12, 1 - 1e-12)) + jitter)
    else:  # raw margins (`svm-two-sided`)
        shadow = s + jitter
    return side(s, y, pop.threshold), side(shadow, y, pop.threshold), y


@dataclass
class SideRun:
    """One classifier's runs at its stop: labels, interval, and which items it requested."""

    labels: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    requested: np.ndarray  # (runs, items) bool


def sample(sd: Side, y: np.ndarray, u: np.ndarray, delta: float, confidence: float) -> SideRun:
    """The classifier's rounds until its stopping rule holds, on priorities `u` (runs x items):
    stratum k's sample is its ``n_k`` items of the lowest priority."""
    runs, K = u.shape[0], sd.N.size
    members = [np.flatnonzero(sd.stratum == k) for k in range(K)]
    order = [np.argsort(u[:, m], axis=1) for m in members]
    cum_y = [np.concatenate([np.zeros((runs, 1), np.int64), np.cumsum(y[m][o], axis=1)], axis=1)
             for m, o in zip(members, order)]
    n, h = np.zeros((runs, K), np.int64), np.zeros((runs, K), np.int64)
    streak, done = np.zeros(runs, np.int64), np.zeros(runs, bool)
    D = allocation.round_size(K)
    lower, upper = np.full(runs, np.nan), np.full(runs, np.nan)
    while not done.all():
        alloc = allocation.allocate_opt_track(sd.N, n, h, sd.q, D, with_replacement=False)
        alloc[done] = 0
        n += alloc
        h = np.stack([cum_y[k][np.arange(runs), n[:, k]] for k in range(K)], axis=1)
        iv = estimator.wilson_interval(sd.N, n, h, confidence, True)
        streak = np.where(done, streak, stopping.next_streak(streak, iv.halfwidth, delta))
        stop = ~done & (stopping.should_stop(streak) | (alloc.sum(axis=1) == 0))
        lower[stop], upper[stop] = iv.lower[stop], iv.upper[stop]
        done |= stop
    requested = np.zeros(u.shape, bool)
    for k, (m, o) in enumerate(zip(members, order)):
        taken = np.arange(m.size)[None, :] < n[:, k:k + 1]  # the first n_k in priority order
        rows = np.repeat(np.arange(runs), m.size).reshape(runs, m.size)
        requested[rows[taken], m[o][taken]] = True
    return SideRun(n.sum(axis=1), lower, upper, requested)


def study(pop: WholeStream, delta: float, runs: int, seed: int, confidence: float = 0.95,
          noise: float = NOISE) -> dict:
    """The pair's requests with independent and with shared priorities, each classifier's alone,
    and each one's coverage of its chunk's precision (module docstring)."""
    model, shadow, y = pair(pop, seed, noise)
    rng = np.random.default_rng([seed, 8])
    out: dict[str, list] = {k: [] for k in ("model", "shadow", "independent", "shared", "cover_model",
                                            "cover_shadow")}
    for start in range(0, runs, BLOCK):
        b = min(BLOCK, runs - start)
        u_model, u_other = rng.random((b, y.size)), rng.random((b, y.size))
        m = sample(model, y, u_model, delta, confidence)
        s_own = sample(shadow, y, u_other, delta, confidence)
        s_shared = sample(shadow, y, u_model, delta, confidence)
        out["model"].append(m.labels)
        out["shadow"].append(s_shared.labels)
        out["independent"].append((m.requested | s_own.requested).sum(axis=1))
        out["shared"].append((m.requested | s_shared.requested).sum(axis=1))
        out["cover_model"].append((m.lower <= model.truth) & (model.truth <= m.upper))
        out["cover_shadow"].append((s_shared.lower <= shadow.truth) & (shadow.truth <= s_shared.upper))
    r = {k: np.concatenate(v) for k, v in out.items()}
    larger = np.maximum(r["model"], r["shadow"])
    agree = float(np.mean((model.stratum >= 0) == (shadow.stratum >= 0)))
    return {"population": pop.name, "items": int(y.size), "noise": noise, "delta": delta, "runs": runs,
            "seed": seed, "decisions_agree": round(agree, 4),
            "precision": {"model": round(model.truth, 4), "shadow": round(shadow.truth, 4)},
            "requests_alone": {"model": float(r["model"].mean()), "shadow": float(r["shadow"].mean())},
            "requests_pair": {"independent": float(r["independent"].mean()), "shared": float(r["shared"].mean())},
            "pair_vs_larger": {"independent": float(np.mean(r["independent"] / larger)),
                               "shared": float(np.mean(r["shared"] / larger))},
            "coverage": {"model": float(r["cover_model"].mean()), "shadow": float(r["cover_shadow"].mean())}}


def main(args) -> int:
    """`simulate --shadow --builtin POP`: the study as a few lines or one JSON document."""
    import json
    import sys

    from .options import DEFAULT_DELTA
    from .whole_populations import WHOLE_BUILTIN, whole_builtin

    name = args.builtin or "moderation"
    noise = NOISE if args.shadow_noise is None else args.shadow_noise
    if name not in WHOLE_BUILTIN or WHOLE_BUILTIN[name][1] is None or not noise >= 0:
        print("stratameter simulate: error: --shadow needs a whole-stream --builtin with a threshold ("
              + ", ".join(k for k, v in WHOLE_BUILTIN.items() if v[1] is not None) + ") and --shadow-noise >= 0",
              file=sys.stderr)
        return 2
    confidence = args.confidence if args.confidence is not None else 1.0 - (args.alpha or 0.05)
    delta = args.delta if args.delta is not None else DEFAULT_DELTA
    doc = study(whole_builtin(name), delta, args.runs, args.seed, confidence, noise)
    if args.json:
        print(json.dumps(doc))
        return 0
    alone, pair_, vs = doc["requests_alone"], doc["requests_pair"], doc["pair_vs_larger"]
    print(f"{name}: a model and its shadow (noise {noise} on the margin, decisions agree on "
          f"{100 * doc['decisions_agree']:.1f} % of {doc['items']} items), precision to delta {delta}, {args.runs} runs")
    print(f"  alone: model {alone['model']:.0f} requests, shadow {alone['shadow']:.0f}")
    print(f"  the pair, independent priorities: {pair_['independent']:.0f} ({vs['independent']:.3f} x the larger)")
    print(f"  the pair, shared priorities:      {pair_['shared']:.0f} ({vs['shared']:.3f} x the larger)")
    print(f"  coverage: model {doc['coverage']['model']:.3f}, shadow {doc['coverage']['shadow']:.3f}")
    return 0
