"""The reported estimate of recall, F1 and accuracy at fixed label budgets, on every built-in
whole-stream population: the default design (strata on both sides of the threshold, `opt_track`
on the linearised metric) run with no stopping rule and read at each budget, as a dashboard reads
an open chunk.  2000 runs a cell: the bias bar is |mean(estimate - truth)| <= 0.005 + 2 s.e. and
the interval covers >= 0.93 (s.e. 0.0055 at 0.95).  The budgets give each cell a few dozen truly
positive labels at least: rare-positive populations start at 1,000 labels."""

from __future__ import annotations

import numpy as np
import pytest

from stratameter.simulate import budget
from stratameter.simulate.whole import WholeDesign, prepare_whole, run_whole_budget
from stratameter.simulate.whole_populations import WHOLE_BUILTIN, whole_builtin

RUNS = 2000
CELLS = [(name, metric) for name in WHOLE_BUILTIN for metric in whole_builtin(name, size=2000).metrics_defined()
         if metric != "precision"]


def budgets_for(prevalence: float) -> list[int]:
    return [400, 800, 1600] if prevalence >= 0.05 else [1000, 2000, 4000]


@pytest.mark.slow
@pytest.mark.parametrize("name,metric", CELLS)
def test_fixed_budget_bias_and_coverage(name, metric):
    pop = whole_builtin(name)
    design = WholeDesign()
    budgets = budgets_for(pop.prevalence)
    r = run_whole_budget(prepare_whole(pop, design, [metric]), design, [metric], budgets, RUNS,
                         np.random.SeedSequence([21, CELLS.index((name, metric))]))
    truth = pop.truth(metric)
    for i, n in enumerate(budgets):
        f = budget.figures(r.estimate[metric][i], r.lower[metric][i], r.upper[metric][i], truth,
                           pop.srs_variance(metric, n))
        assert f["no_estimate"] == 0.0, (n, f)
        assert abs(f["bias"]) <= 0.005 + 2 * f["bias_se"], (n, f)
        assert f["coverage"] >= 0.93, (n, f)


def test_srs_variance_of_recall_is_the_closed_form():
    """Recall's influence function gives R (1 - R) / (n prevalence) exactly."""
    pop = whole_builtin("moderation", size=20_000)
    R, prev = pop.truth("recall"), pop.prevalence
    assert pop.srs_variance("recall", 400) == pytest.approx(R * (1 - R) / (400 * prev), rel=1e-9)
    A = pop.truth("accuracy")
    assert pop.srs_variance("accuracy", 100) == pytest.approx(A * (1 - A) / 100, rel=1e-9)
