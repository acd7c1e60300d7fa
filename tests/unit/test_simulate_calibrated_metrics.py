"""`stratameter simulate --calibration --metric recall|f1|accuracy` (service/simulate/calibrated.py,
`Chunk.of_whole`): the service's design over both sides of the threshold, with and without the
difference estimator, paired on common random numbers."""

from __future__ import annotations

import json

import numpy as np
import pytest

from stratameter.simulate.calibrated import Chunk, cell, design
from stratameter.simulate.whole_populations import whole_builtin


def test_a_whole_stream_chunk_has_the_services_strata_on_both_sides():
    pop = whole_builtin("moderation", size=20_000)
    chunk = Chunk.of_whole(pop, "recall")
    assert chunk.positive.tolist() == [True] * 4 + [False] * 4
    pred = pop.predicted_positive
    assert chunk.N[:4].sum() == pred.sum() and chunk.N[4:].sum() == (~pred).sum()
    assert np.array_equal(chunk.positive[chunk.stratum], pred)  # every item in a stratum of its own side
    assert chunk.truth == pop.truth("recall") and chunk.target.metrics == ("recall",)
    # the stacked grid holds every item of each side, shared between strata by bucket (as in the service)
    mass = chunk.grid.counts.sum(axis=1)
    assert (mass[:4].sum(), mass[4:].sum()) == pytest.approx((chunk.N[:4].sum(), chunk.N[4:].sum()))
    assert mass == pytest.approx(chunk.N, rel=0.01)
    every = Chunk.of_whole(whole_builtin("multiclass-confidence", size=20_000), "accuracy")
    assert every.positive.tolist() == [True] * 4  # no predicted negative: no negative strata


@pytest.mark.parametrize("metric", ["recall", "f1", "accuracy"])
def test_off_the_design_is_todays_exactly(metric):
    """With the calibration off (`min_labels` 0) the design stops where today's does, whatever
    the metric: the same labels, estimate and interval as a run that never reaches the minimum."""
    chunk = Chunk.of_whole(whole_builtin("balanced", size=20_000), metric)
    rng = np.random.default_rng(2)
    order = [rng.permutation(m) for m in chunk.members]
    folds = rng.integers(0, 2, chunk.stratum.size)
    off = design(chunk, 0.06, 0.95, order, folds, 0, closed=True)
    never = design(chunk, 0.06, 0.95, order, folds, 10**9, closed=True)
    assert off == never and not off.active


@pytest.mark.slow
def test_the_command_runs_a_metric_and_refuses_what_does_not_apply(capsys):
    from stratameter.cli import main

    argv = ["simulate", "--calibration", "--metric", "accuracy", "--builtin", "balanced", "--delta", "0.08",
            "--runs", "6", "--workers", "1"]
    assert main(argv + ["--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["metric"] == "accuracy" and doc["runs"] == 6 and doc["labels_plain"] > 0
    assert 0.0 <= doc["coverage_calibrated"] <= 1.0
    assert main(argv) == 0
    assert "accuracy" in capsys.readouterr().out
    for extra, what in ((["--negative-strata", "8"], "--negative-strata"), (["--stream"], "--stream"),
                        (["--margin-strata"], "--margin-strata")):
        assert main(argv + extra) == 2
        assert what in capsys.readouterr().err
    assert main(["simulate", "--calibration", "--metric", "recall", "--builtin", "multiclass-confidence",
                 "--runs", "2"]) == 2
    assert "not defined" in capsys.readouterr().err


@pytest.mark.slow
def test_precision_of_a_whole_stream_is_its_predicted_positives_design():
    """`cell` on a whole stream for precision alone samples its predicted positives, as the service
    does when precision is the only metric."""
    pop = whole_builtin("balanced", size=20_000)
    c = cell(pop, 0.08, 20, seed=1, metric="precision", workers=1)
    assert c == cell(pop.positives_only(), 0.08, 20, seed=1, workers=1)
