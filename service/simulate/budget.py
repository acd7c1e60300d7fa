"""What `stratameter simulate --budget` reports of one design at one fixed label count.

Kumar & Raj compare designs at a fixed number of labels by the mean squared error of their
estimates.  Each figure here comes with its standard error, so a table says which differences are
real: the MSE as a ratio to the closed-form variance of simple random sampling with the plain sample
proportion, ``p (1 - p) / n`` (times ``(N - n) / (N - 1)`` without replacement; Cochran 1977,
Eq. 3.5), the bias of the reported estimate, the interval's coverage and its mean width.

Runs without an estimate at the budget (a stratum with no label yet) are not dropped silently:
``no_estimate`` is their share and every other figure is over the runs that have one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass
class BudgetSummary:
    """One design at one budget (see the module docstring)."""

    method: str
    stratification: str
    budget: int
    mse: float  # over the runs with an estimate (NaN if none)
    mse_ratio_vs_random: float | None  # None unless both designs have an estimate in every run
    ci_coverage: float  # over the runs with an interval
    mean_abs_error: float
    no_estimate: float = 0.0  # share of runs with no estimate at the budget
    srs_variance: float = math.nan  # p (1 - p) / n, the closed form of simple random sampling
    mse_ratio_vs_srs: float = math.nan
    mse_ratio_vs_srs_se: float = math.nan
    bias: float = math.nan  # mean of estimate - truth
    bias_se: float = math.nan
    ci_coverage_se: float = math.nan
    mean_width: float = math.nan
    mean_width_se: float = math.nan


def srs_variance(p: float, n: int, population: int | None = None) -> float:
    """``p (1 - p) / n``: the variance of the sample proportion of a simple random sample of `n`,
    with replacement, or without it from `population` items, times ``(N - n) / (N - 1)``
    (Cochran 1977, Eq. 3.5)."""
    if n < 1:
        raise ValueError(f"a sample has at least one label, got {n!r}")
    v = p * (1.0 - p) / n
    if population is not None and population > 1:
        v *= max(population - n, 0) / (population - 1)
    return v


def _mean_se(x: np.ndarray) -> tuple[float, float]:
    if x.size == 0:
        return math.nan, math.nan
    return float(x.mean()), float(x.std(ddof=1) / math.sqrt(x.size)) if x.size > 1 else math.nan


def figures(estimate, lower, upper, truth: float, reference_variance: float) -> dict:
    """The figures of `BudgetSummary` from one budget's runs (arrays over runs), the MSE's ratio
    taken to `reference_variance` (`srs_variance`, or the linearised metric's closed form)."""
    err = np.asarray(estimate, dtype=float) - truth
    has = np.isfinite(err)
    lower, upper = np.asarray(lower, dtype=float), np.asarray(upper, dtype=float)
    has_iv = np.isfinite(lower) & np.isfinite(upper)
    mse, mse_se = _mean_se(err[has] ** 2)
    bias, bias_se = _mean_se(err[has])
    covered = ((lower <= truth) & (truth <= upper))[has_iv].astype(float)
    coverage, coverage_se = _mean_se(covered)
    width, width_se = _mean_se((upper - lower)[has_iv])
    ref = reference_variance if reference_variance > 0 else math.nan
    return {
        "mse": mse, "mae": float(np.mean(np.abs(err[has]))) if has.any() else math.nan,
        "no_estimate": float(1.0 - has.mean()), "srs_variance": reference_variance,
        "mse_ratio_vs_srs": mse / ref, "mse_ratio_vs_srs_se": mse_se / ref,
        "bias": bias, "bias_se": bias_se, "coverage": coverage, "coverage_se": coverage_se,
        "mean_width": width, "mean_width_se": width_se,
    }


def summaries(designs, results: list[dict], budgets) -> list[BudgetSummary]:
    """Rows per budget, then per design (row 0 of each budget is random); the MSE ratio to random
    only where both it and random have an estimate in every run (otherwise it would compare MSEs
    over differently selected runs)."""
    rows = []
    for b, budget in enumerate(budgets):
        base = results[0]["budgets"][b]
        for d, r in zip(designs, results):
            f = r["budgets"][b]
            comparable = f["no_estimate"] == 0 and base["no_estimate"] == 0 and base["mse"] > 0
            rows.append(BudgetSummary(
                method=d.method, stratification="none" if d.method == "random" else d.stratification,
                budget=int(budget), mse=f["mse"], mse_ratio_vs_random=f["mse"] / base["mse"] if comparable else None,
                ci_coverage=f["coverage"], mean_abs_error=f["mae"], no_estimate=f["no_estimate"],
                srs_variance=f["srs_variance"], mse_ratio_vs_srs=f["mse_ratio_vs_srs"],
                mse_ratio_vs_srs_se=f["mse_ratio_vs_srs_se"], bias=f["bias"], bias_se=f["bias_se"],
                ci_coverage_se=f["coverage_se"], mean_width=f["mean_width"], mean_width_se=f["mean_width_se"],
            ))
    return rows


def parse_budgets(text: str | None) -> list[int] | None:
    """``--budget 100,200,400``: sorted distinct positive label counts (None when not given)."""
    if text is None:
        return None
    try:
        values = sorted({int(x) for x in str(text).split(",") if x.strip()})
    except ValueError:
        raise ValueError(f"--budget takes positive label counts separated by commas, got {text!r}") from None
    if not values or values[0] < 1:
        raise ValueError(f"--budget takes positive label counts separated by commas, got {text!r}")
    return values


def budget_table(table, rows: list[BudgetSummary]) -> None:
    """The rows as columns of a rich `table`, with a legend in its caption."""
    for col in ("method", "strata", "labels", "MSE / p(1-p)/n", "bias", "cover", "width", "MSE / random"):
        table.add_column(col, justify="left" if col in ("method", "strata") else "right", no_wrap=True)
    for r in rows:
        ratio = "-" if r.mse_ratio_vs_random is None else f"{r.mse_ratio_vs_random:.3f}"
        table.add_row(r.method, r.stratification, str(r.budget),
                      f"{r.mse_ratio_vs_srs:.3f} ± {r.mse_ratio_vs_srs_se:.3f}",
                      f"{r.bias:+.4f} ± {r.bias_se:.4f}", f"{r.ci_coverage:.3f} ± {r.ci_coverage_se:.3f}",
                      f"{r.mean_width:.4f}", ratio)
    table.caption = ("MSE / p(1-p)/n: the mean squared error over the closed-form variance of simple random "
                     "sampling's plain proportion (< 1: fewer labels than random for the same error); "
                     "bias: mean estimate - truth; cover: the interval's coverage of the truth; "
                     "± one standard error")
