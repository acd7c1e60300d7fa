"""A peer benchmark: stratameter's default design against PPI++ and simple random sampling.

PPI++ (prediction-powered inference with power tuning; Angelopoulos, Duchi & Zrnic 2023,
"PPI++: Efficient Prediction-Powered Inference", arXiv:2311.01453) estimates a mean from a few
labels and a model's predictions on every item: ``lam mean(f(unlabelled)) + mean(Y - lam f(X))``,
with ``lam`` chosen from the data to minimise the variance (``lam = 0`` is the sample mean, so it
is never asymptotically worse than it), and a normal (CLT) interval.  It is run here from the
reference implementation, the PyPI package ``ppi-python`` (``ppi_py``, the ``[peers]`` extra).

On one population, at fixed label budgets, R runs per method, each with its own seeded stream:

* ``default``: the service's design (`engine.Design()`: ``opt_track`` on K = 4 ``perc`` strata),
  its `Interval.estimate` and Wilson interval, `engine.run_budget` with replacement;
* ``random``: a simple random sample with replacement, the plain sample proportion and the
  same Wilson interval on one stratum (`engine.run_budget` with ``Design("random", "perc", 1)``);
* ``ppi++``: n items drawn uniformly with replacement and labelled; the prediction ``f`` is a
  Platt fit (logistic regression of label on standardised score, ridge `RIDGE`) on that run's own
  labels, applied to every item of the population (all of it is the unlabelled set, so the
  imputed term's mean is the population's own and adds no error of a fixed subsample);
  ``ppi_py.ppi_mean_ci`` with ``lam=None`` (power tuning) and its centre, the point estimate.
  The first n draws of a run are the labels at budget n, as for the other designs.

Per budget and method (`PeerRow`): the MSE as a ratio to ``p (1 - p) / n`` (p the population's
truth), the bias, the interval's coverage and mean width, each with its standard error, and the
MSE ratio's difference to PPI++'s (independent samples: ``se = sqrt(se1^2 + se2^2)``).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import asdict, dataclass

import numpy as np
from scipy.special import expit

from . import budget, engine
from .populations import Population

RIDGE = 1e-2  # on the standardised score's logistic coefficients (intercept and slope): 0.5 RIDGE |theta|^2
METHODS = ("default", "random", "ppi++")
#: Runs per batch of `ppi_py` calls: each run's predictions are one column (its power tuning is
#: per column, ``lam_optim_mode="element"``), so a batch costs one call and not one per run.
BATCH = 16


@dataclass
class PeerRow:
    """One method at one budget: every figure over all runs, ``*_se`` its standard error."""

    method: str
    budget: int
    runs: int
    mse_ratio: float  # mean((estimate - p)^2) / (p (1 - p) / n)
    mse_ratio_se: float
    bias: float  # mean(estimate - p)
    bias_se: float
    coverage: float  # share of runs whose 95% interval contains p
    coverage_se: float
    width: float  # mean interval width
    width_se: float
    no_estimate: float = 0.0  # share of runs without an estimate (excluded from the figures above)
    diff_vs_ppi: float | None = None  # this mse_ratio - PPI++'s (None on PPI++'s own row)
    diff_vs_ppi_se: float | None = None


def platt_fit(x: np.ndarray, y: np.ndarray, ridge: float = RIDGE, iterations: int = 100) -> np.ndarray:
    """Ridge logistic regression ``P(y=1 | x) = expit(a + b x)``, one per row of `x` and `y`
    (shape ``(runs, n)``), by Newton's method (IRLS): minimises the negative log-likelihood plus
    ``ridge / 2 (a^2 + b^2)``, strictly convex, so the ridge keeps a sample whose labels all agree
    (or are separated by the score) at a finite fit.  Returns ``(runs, 2)``: ``a, b``."""
    x, y = np.atleast_2d(np.asarray(x, float)), np.atleast_2d(np.asarray(y, float))
    theta = np.zeros((x.shape[0], 2))
    for _ in range(iterations):
        p = expit(theta[:, :1] + theta[:, 1:] * x)
        r, w = p - y, p * (1.0 - p)
        g = np.stack([r.sum(1) + ridge * theta[:, 0], (r * x).sum(1) + ridge * theta[:, 1]], axis=1)
        h00, h01, h11 = w.sum(1) + ridge, (w * x).sum(1), (w * x * x).sum(1) + ridge
        det = h00 * h11 - h01 * h01
        step = np.stack([(h11 * g[:, 0] - h01 * g[:, 1]) / det, (h00 * g[:, 1] - h01 * g[:, 0]) / det], axis=1)
        scale = np.minimum(1.0, 5.0 / np.maximum(np.abs(step).max(1, keepdims=True), 1e-300))
        theta -= step * scale  # a Newton step, capped at 5 per coordinate (far from the optimum only)
        if np.abs(step).max() < 1e-10:
            break
    return theta


def ppi_plus_plus(Y: np.ndarray, Yhat: np.ndarray, Yhat_unlabeled: np.ndarray, confidence: float = 0.95):
    """PPI++'s point estimate and interval from ``ppi_py.ppi_mean_ci`` with power tuning
    (``lam=None``), one per column: `Y` and `Yhat` ``(n, runs)``, `Yhat_unlabeled` ``(N, runs)``;
    ``lam`` is tuned per column (``lam_optim_mode="element"``: each column's own one-dimensional
    tuning, as a call per run would do).  The estimate is the interval's midpoint: ``ppi_mean_ci``
    is the z-interval around ``ppi_mean_pointestimate(lam=None)``, whose ``lam`` it computes from
    the same pilot (``lam=1``) estimate (tests/unit/test_peers.py holds the two equal), so a second call
    would only repeat its passes over the N predictions.  Returns ``(estimate, lower, upper)``."""
    import ppi_py

    lower, upper = ppi_py.ppi_mean_ci(Y, Yhat, Yhat_unlabeled, alpha=1.0 - confidence, lam=None,
                                      lam_optim_mode="element")
    lower, upper = (np.atleast_1d(np.asarray(v, float).squeeze()) for v in (lower, upper))
    return (lower + upper) / 2.0, lower, upper


def run_ppi(pop: Population, budgets, runs: int, seed, confidence: float = 0.95) -> dict[str, np.ndarray]:
    """R runs of PPI++ on `pop` at each budget: ``estimate``, ``lower``, ``upper`` of shape
    ``(budgets, runs)``.  A run's labels at budget n are its first n uniform draws."""
    budgets = sorted(int(b) for b in budgets)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, pop.size, size=(runs, budgets[-1]))
    mu, sd = float(pop.scores.mean()), float(pop.scores.std()) or 1.0
    z = (pop.scores - mu) / sd  # the standardised score of every item: the unlabelled set
    out = {k: np.full((len(budgets), runs), np.nan) for k in ("estimate", "lower", "upper")}
    with _one_blas_thread():
        _fill_ppi(out, pop.labels, z, draws, budgets, confidence)
    return out


def _one_blas_thread():
    """One BLAS thread while `ppi_py` runs: its per-batch covariances are small matrix products,
    which threads only slow down (about 2x here); threadpoolctl comes with ppi-python's scikit-learn."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return contextlib.nullcontext()
    return threadpool_limits(1)


def _fill_ppi(out: dict, labels: np.ndarray, z: np.ndarray, draws: np.ndarray, budgets, confidence) -> None:
    """`run_ppi`'s loop: per budget, the runs' Platt fits at once, then `ppi_plus_plus` per `BATCH`."""
    runs = draws.shape[0]
    for b, n in enumerate(budgets):
        idx = draws[:, :n]
        zl, yl = z[idx], labels[idx].astype(float)
        theta = platt_fit(zl, yl)
        for start in range(0, runs, BATCH):
            t = theta[start:start + BATCH]
            Yhat = expit(t[:, 0] + t[:, 1] * zl[start:start + BATCH].T)  # (n, batch)
            Yhat_unlabeled = expit(t[:, 0] + t[:, 1] * z[:, None])  # (N, batch)
            res = ppi_plus_plus(yl[start:start + BATCH].T, Yhat, Yhat_unlabeled, confidence)
            for key, value in zip(("estimate", "lower", "upper"), res):
                out[key][b, start:start + BATCH] = value


def _design_runs(pop: Population, design: engine.Design, budgets, runs: int, seed, confidence):
    res = engine.run_budget(engine.prepare(pop, design), design, budgets, runs, seed, confidence,
                            with_replacement=True)
    return {"estimate": res.estimate, "lower": res.lower, "upper": res.upper}


def _row(method: str, n: int, est, lower, upper, truth: float) -> PeerRow:
    f = budget.figures(est, lower, upper, truth, budget.srs_variance(truth, n))
    return PeerRow(method, n, int(np.size(est)), f["mse_ratio_vs_srs"], f["mse_ratio_vs_srs_se"], f["bias"],
                   f["bias_se"], f["coverage"], f["coverage_se"], f["mean_width"], f["mean_width_se"],
                   no_estimate=f["no_estimate"])


def compare(pop: Population, budgets, runs: int, seed: int = 0, confidence: float = 0.95) -> list[PeerRow]:
    """The three methods (`METHODS`) at each budget on `pop`, R `runs` each; rows per budget, then
    per method.  Each method has its own stream of `seed`'s `SeedSequence` (their samples differ)."""
    budgets = sorted({int(b) for b in budgets})
    if not budgets or budgets[0] < 2:
        raise ValueError("budgets must be label counts >= 2")
    if runs < 2:
        raise ValueError("runs must be >= 2")
    seeds = np.random.SeedSequence(seed).spawn(len(METHODS))
    results = {
        "default": _design_runs(pop, engine.Design(), budgets, runs, seeds[0], confidence),
        "random": _design_runs(pop, engine.Design("random", "perc", 1), budgets, runs, seeds[1], confidence),
        "ppi++": run_ppi(pop, budgets, runs, seeds[2], confidence),
    }
    rows = []
    for b, n in enumerate(budgets):
        here = {m: _row(m, n, *(results[m][k][b] for k in ("estimate", "lower", "upper")), pop.truth)
                for m in METHODS}
        ppi = here["ppi++"]
        for m in METHODS:
            row = here[m]
            if m != "ppi++":
                row.diff_vs_ppi = row.mse_ratio - ppi.mse_ratio
                row.diff_vs_ppi_se = math.hypot(row.mse_ratio_se, ppi.mse_ratio_se)
            rows.append(row)
    return rows


def as_json(pop: Population, rows: list[PeerRow], seed: int, confidence: float = 0.95) -> dict:
    """One JSON document: the population, the protocol and the rows."""
    return {
        "population": pop.name, "size": pop.size, "truth": pop.truth, "seed": seed,
        "confidence": confidence, "runs": rows[0].runs if rows else 0,
        "budgets": sorted({r.budget for r in rows}), "methods": list(METHODS),
        "ppi_unlabeled": f"every item of the population ({pop.size})",
        "rows": [asdict(r) for r in rows],
    }


def print_table(pop: Population, rows: list[PeerRow], seed: int) -> None:
    """A plain-text table, one line per budget and method."""
    runs = rows[0].runs if rows else 0
    print(f"{pop.name}: {pop.size} items, precision {pop.truth:.4f}; runs={runs}, seed={seed}; "
          "figures +- s.e.; MSE as a ratio to p(1-p)/n")
    head = f"{'n':>5} {'method':<8} {'MSE ratio':>16} {'bias':>20} {'cover':>14} {'width':>18} {'vs PPI++':>17}"
    print(head)
    print("-" * len(head))
    for r in rows:
        diff = "" if r.diff_vs_ppi is None else f"{r.diff_vs_ppi:+.3f} +- {r.diff_vs_ppi_se:.3f}"
        print(f"{r.budget:>5} {r.method:<8} {r.mse_ratio:>7.3f} +- {r.mse_ratio_se:.3f} "
              f"{r.bias:>+9.5f} +- {r.bias_se:.5f} {r.coverage:>6.3f} +- {r.coverage_se:.3f} "
              f"{r.width:>7.4f} +- {r.width_se:.4f} {diff:>17}"
              + (f"  ({100 * r.no_estimate:.1f}% no estimate)" if r.no_estimate else ""))
