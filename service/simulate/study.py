"""The label-efficiency study behind `stratameter simulate`.

For each design (allocation x stratification) it runs Bennett & Carvalho's
protocol R times and summarises: mean labels at stop (+- s.e.), the interval's
coverage of the truth (the honesty figure), InConf (share of runs whose
estimate is within delta of the truth; kept for continuity, not a bar),
%Change vs random and %Oracle (both as in Bennett & Carvalho 2010, Table 1:
percent change of the label count relative to random sampling and to the
closed-form Neyman bound of the design's own binning), and %Jeffreys: the
percent change relative to `stats.oracle.jeffreys_oracle_labels`, the fewest
labels any allocation needs for the default interval's half-label-smoothed
variance to reach the target (the floor of an honest interval where strata
are nearly pure).  Beside `random`'s labels at stop, the closed form of
simple random sampling with a normal interval (`srs_normal_labels`).

``random`` is the honest baseline: simple random sampling with the plain
sample proportion as its estimate (`engine.reported`), stopped by the same
interval family and rule as the other designs so its labels at stop compare.

With budgets (`--budget 100,200,400`) it reports, per budget, Kumar & Raj's
mean squared error at a fixed label count as a ratio to ``p (1 - p) / n`` and
to random's, with bias, coverage and width, each with its standard error
(`budget`), runs without an estimate counted there and not dropped.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np

from ..stats.allocation import ALLOCATIONS, DEFAULT_ALLOCATION
from ..stats.estimator import z_value
from ..stats.strata import STRATIFICATIONS
from . import budget
from .engine import Design, Protocol, prepare, run_budget, run_until_stop
from .parallel import map_in_processes
from .populations import Population

DEFAULT_STRATIFICATION = "perc"


@dataclass
class DesignSummary:
    method: str
    stratification: str
    labels_mean: float
    labels_se: float
    in_conf: float
    ci_coverage: float
    stopped: float
    oracle_labels: float
    jeffreys_oracle_labels: float
    change_vs_random: float | None = None
    pct_oracle: float | None = None
    pct_jeffreys_oracle: float | None = None


@dataclass
class StudyRequest:
    population: Population
    designs: list[Design]
    protocol: Protocol
    runs: int
    seed: int
    budgets: list[int] | None = None  # fixed label counts (`--budget`); None: the stopping mode
    curve: list[int] = field(default_factory=list)  # label counts for the error-vs-labels plot


def designs_for(methods: list[str] | None, stratifications: list[str] | None, strata: int) -> list[Design]:
    """The designs to compare; `random` is always included (the baseline)."""
    methods = methods or [DEFAULT_ALLOCATION]
    for m in methods:
        if m not in ALLOCATIONS:
            raise ValueError(f"unknown method {m!r}; choose from {', '.join(ALLOCATIONS)}")
    strats = stratifications or [DEFAULT_STRATIFICATION]
    for s in strats:
        if s not in STRATIFICATIONS:
            raise ValueError(f"unknown stratification {s!r}; choose from {', '.join(STRATIFICATIONS)}")
    out = [Design("random", DEFAULT_STRATIFICATION, 1)]
    for m in methods:
        if m == "random":
            continue
        out += [Design(m, s, strata) for s in strats]
    return out


def _one_design(args) -> tuple[int, dict]:
    index, req, design = args
    st = prepare(req.population, design)
    seed = np.random.SeedSequence([req.seed, index])
    fpc = not req.protocol.with_replacement
    result: dict = {"oracle": st.oracle_labels(req.protocol.delta, req.protocol.confidence, fpc)}
    truth = req.population.truth
    if req.budgets is None:
        result["jeffreys_oracle"] = st.jeffreys_oracle_labels(req.protocol.delta, req.protocol.confidence, fpc)
        r = run_until_stop(st, design, req.protocol, req.runs, seed)
        result["labels"] = r.labels
        result["in_conf"] = float(np.mean(np.abs(r.estimate - truth) <= req.protocol.delta))
        result["coverage"] = float(np.mean((r.lower <= truth) & (truth <= r.upper)))
        result["stopped"] = float(np.mean(r.stopped))
    else:
        b = run_budget(st, design, req.budgets, req.runs, seed, req.protocol.confidence,
                       req.protocol.with_replacement, req.protocol.labels_per_stratum)
        size = None if req.protocol.with_replacement else req.population.size
        result["budgets"] = [budget.figures(b.estimate[i], b.lower[i], b.upper[i], truth,
                                            budget.srs_variance(truth, int(n), size))
                             for i, n in enumerate(b.budgets)]
    if req.curve:
        c = run_budget(st, design, req.curve, min(req.runs, 500), np.random.SeedSequence([req.seed, index, 1]),
                       req.protocol.confidence, req.protocol.with_replacement, req.protocol.labels_per_stratum)
        result["curve_labels"] = c.budgets
        result["curve_mae"] = np.nanmean(np.abs(c.estimate - truth), axis=1)
        result["curve_coverage"] = np.mean((c.lower <= truth) & (truth <= c.upper), axis=1)
    return index, result


def run_study(req: StudyRequest, progress: Callable[[int, int], None] | None = None,
              workers: int | None = None) -> list[dict]:
    """Run every design; results in the order of `req.designs`.

    Designs run in parallel processes (one per core, 2 here) when there is more
    than one: each design's runs are already vectorised, so parallelism pays
    across designs, not within one.
    """
    tasks = [(i, req, d) for i, d in enumerate(req.designs)]
    return [r for _, r in map_in_processes(_one_design, tasks, progress, workers)]


def summarise(req: StudyRequest, results: list[dict]) -> list[DesignSummary]:
    """One row per design, with %Change vs the random baseline (row 0)."""
    rows = []
    for d, r in zip(req.designs, results):
        labels = r["labels"]
        rows.append(DesignSummary(
            method=d.method,
            stratification="none" if d.method == "random" else d.stratification,
            labels_mean=float(labels.mean()),
            labels_se=float(labels.std(ddof=1) / math.sqrt(labels.size)) if labels.size > 1 else 0.0,
            in_conf=r["in_conf"], ci_coverage=r["coverage"], stopped=r["stopped"],
            oracle_labels=r["oracle"], jeffreys_oracle_labels=r["jeffreys_oracle"],
        ))
    base = rows[0].labels_mean
    for row in rows:
        row.change_vs_random = 100.0 * (row.labels_mean / base - 1.0)
        # A population whose strata are all pure needs no labels under Neyman
        # allocation: %Oracle is undefined then (None, "-" in the table).
        row.pct_oracle = _pct_over(row.labels_mean, row.oracle_labels)
        row.pct_jeffreys_oracle = _pct_over(row.labels_mean, row.jeffreys_oracle_labels)
    return rows


def _pct_over(labels: float, oracle_labels: float) -> float | None:
    return 100.0 * (labels / oracle_labels - 1.0) if oracle_labels > 0 else None


def pct_text(value: float | None) -> str:
    """A table's cell for a signed percentage such as %Oracle (``-`` where it is undefined)."""
    return "-" if value is None else f"{value:+.1f}"


def summarise_budget(req: StudyRequest, results: list[dict]) -> list[budget.BudgetSummary]:
    """Per budget, one row per design (`budget.summaries`)."""
    return budget.summaries(req.designs, results, req.budgets)


def srs_normal_labels(p: float, delta: float, confidence: float, population: int | None = None) -> float:
    """Labels simple random sampling needs for a normal interval of half-width `delta` around a
    proportion `p`: ``n0 = z^2 p (1 - p) / delta^2``, or without replacement from `population`
    items ``n0 / (1 + (n0 - 1) / N)`` (Cochran 1977, Eq. 4.1-4.2): the closed form beside
    `random`'s labels at stop."""
    z = z_value(confidence)
    n0 = z * z * p * (1.0 - p) / (delta * delta)
    return n0 / (1.0 + (n0 - 1.0) / population) if population else n0


def as_json(req: StudyRequest, rows: list) -> dict:
    """The machine-readable document of `stratameter simulate --json`."""
    default = Design()
    st = prepare(req.population, default)
    fpc = not req.protocol.with_replacement
    return {
        "population": req.population.name,
        "size": req.population.size,
        "default": {"method": default.method, "stratification": default.stratification},
        "truth": req.population.truth,
        "oracle_labels": st.oracle_labels(req.protocol.delta, req.protocol.confidence, fpc),
        "jeffreys_oracle_labels": st.jeffreys_oracle_labels(req.protocol.delta, req.protocol.confidence, fpc),
        "delta": req.protocol.delta,
        "alpha": round(1.0 - req.protocol.confidence, 10),
        "runs": req.runs,
        "strata": default.strata if not req.designs else max(d.strata for d in req.designs),
        "srs_normal_labels": srs_normal_labels(req.population.truth, req.protocol.delta, req.protocol.confidence,
                                               None if req.protocol.with_replacement else req.population.size),
        "budget": req.budgets,
        "methods": [{k: _json_number(v) for k, v in asdict(r).items()} for r in rows],
    }


def _json_number(value):
    """NaN/inf (e.g. the MSE of a budget too small to label every stratum) as
    null: JSON has no NaN, and strict parsers reject the bare token."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
