"""The label-efficiency study behind `stratameter simulate`.

For each design (allocation x stratification) it runs Bennett & Carvalho's
protocol R times and summarises: mean labels at stop (+- s.e.), InConf (share
of runs whose estimate is within delta of the truth), %Change vs random and
%Oracle (both as in Bennett & Carvalho 2010, Table 1: percent change of the
label count relative to random sampling and to the closed-form Neyman bound
of the design's own binning), and %Jeffreys: the percent change relative to
`stats.oracle.jeffreys_oracle_labels`, the fewest labels any allocation needs
for the default interval's half-label-smoothed variance to reach the target
(the floor of an honest interval where strata are nearly pure).  With a
budget it reports Kumar & Raj's mean squared error ratio at a fixed label
count instead.

Budget mode and strata without labels: the stratified estimator has no value
while a non-empty stratum has no label (`estimator.stratified_estimate` is
NaN), which happens at small budgets (e.g. equal-width strata holding 1 % of
the items, or ``opt_a2``'s starved strata).  Such a run is not dropped
silently: ``no_estimate`` is the share of runs with no estimate at the
budget; ``mse``, ``mean_abs_error`` and ``ci_coverage`` are over the runs
that have one; and ``mse_ratio_vs_random`` is reported only when both the
design and random sampling have an estimate in every run (otherwise it
would compare MSEs over differently selected runs) and is null otherwise.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np

from ..stats.allocation import ALLOCATIONS, DEFAULT_ALLOCATION
from ..stats.strata import STRATIFICATIONS
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
class BudgetSummary:
    method: str
    stratification: str
    budget: int
    mse: float  # over the runs with an estimate (NaN if none)
    mse_ratio_vs_random: float | None  # None unless both designs have an estimate in every run
    ci_coverage: float  # over the runs with an interval
    mean_abs_error: float
    no_estimate: float = 0.0  # share of runs with no estimate at the budget


@dataclass
class StudyRequest:
    population: Population
    designs: list[Design]
    protocol: Protocol
    runs: int
    seed: int
    budget: int | None = None
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
    if req.budget is None:
        result["jeffreys_oracle"] = st.jeffreys_oracle_labels(req.protocol.delta, req.protocol.confidence, fpc)
        r = run_until_stop(st, design, req.protocol, req.runs, seed)
        result["labels"] = r.labels
        result["in_conf"] = float(np.mean(np.abs(r.estimate - truth) <= req.protocol.delta))
        result["coverage"] = float(np.mean((r.lower <= truth) & (truth <= r.upper)))
        result["stopped"] = float(np.mean(r.stopped))
    else:
        b = run_budget(st, design, [req.budget], req.runs, seed, req.protocol.confidence,
                       req.protocol.with_replacement, req.protocol.labels_per_stratum)
        err = b.estimate[0] - truth
        has = np.isfinite(err)
        has_iv = np.isfinite(b.lower[0]) & np.isfinite(b.upper[0])
        result["no_estimate"] = float(1.0 - has.mean())
        result["mse"] = float(np.mean(err[has] ** 2)) if has.any() else math.nan
        result["mae"] = float(np.mean(np.abs(err[has]))) if has.any() else math.nan
        covered = (b.lower[0] <= truth) & (truth <= b.upper[0])
        result["coverage"] = float(np.mean(covered[has_iv])) if has_iv.any() else math.nan
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


def summarise_budget(req: StudyRequest, results: list[dict]) -> list[BudgetSummary]:
    """One row per design; the MSE ratio only where both it and random have an
    estimate in every run (see the module docstring)."""
    rows = []
    base, base_missing = results[0]["mse"], results[0]["no_estimate"]
    for d, r in zip(req.designs, results):
        comparable = r["no_estimate"] == 0 and base_missing == 0 and base > 0
        rows.append(BudgetSummary(
            method=d.method, stratification="none" if d.method == "random" else d.stratification,
            budget=int(req.budget or 0), mse=r["mse"],
            mse_ratio_vs_random=r["mse"] / base if comparable else None,
            ci_coverage=r["coverage"], mean_abs_error=r["mae"], no_estimate=r["no_estimate"],
        ))
    return rows


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
        "budget": req.budget,
        "methods": [{k: _json_number(v) for k, v in asdict(r).items()} for r in rows],
    }


def _json_number(value):
    """NaN/inf (e.g. the MSE of a budget too small to label every stratum) as
    null: JSON has no NaN, and strict parsers reject the bare token."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
