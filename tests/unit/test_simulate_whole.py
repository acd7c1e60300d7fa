"""`stratameter simulate --metric recall|f1|accuracy` on whole-stream populations
(service/simulate/whole*.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from stratameter.cli import main
from stratameter.simulate.whole import WholeDesign, fine_strata, margin_strata, prepare_whole
from stratameter.simulate.whole_study import oracle_labels
from stratameter.simulate.whole_populations import WHOLE_BUILTIN, WholeStream, whole_builtin


def run_json(capsys, *args) -> dict:
    assert main(["simulate", *args, "--json", "--workers", "1"]) == 0
    return json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))


def test_whole_stream_populations_are_deterministic_and_varied():
    prevalences = {name: whole_builtin(name, size=50_000).prevalence for name in WHOLE_BUILTIN}
    assert prevalences["fraud-rare"] < 0.015 and prevalences["abuse-rare-weak"] < 0.025
    assert 0.08 < prevalences["moderation"] < 0.12 and 0.45 < prevalences["balanced"] < 0.55
    a, b = whole_builtin("svm-two-sided", size=1000), whole_builtin("svm-two-sided", size=1000)
    assert np.array_equal(a.scores, b.scores) and a.scores.min() < 0 < a.scores.max()
    assert whole_builtin("multiclass-confidence", size=100).metrics_defined() == ("accuracy",)
    assert set(whole_builtin("fraud-rare", size=20_000).metrics_defined()) == {"precision", "recall", "f1", "accuracy"}


def test_truth_of_each_metric_from_the_confusion_matrix():
    pop = whole_builtin("moderation", size=20_000)
    pred, y = pop.predicted_positive, pop.labels == 1
    tp, fp, fn, tn = (np.sum(pred & y), np.sum(pred & ~y), np.sum(~pred & y), np.sum(~pred & ~y))
    assert pop.truth("precision") == pytest.approx(tp / (tp + fp))
    assert pop.truth("recall") == pytest.approx(tp / (tp + fn))
    assert pop.truth("f1") == pytest.approx(2 * tp / (2 * tp + fp + fn))
    assert pop.truth("accuracy") == pytest.approx((tp + tn) / pop.size)


def test_strata_on_both_sides_keep_positive_ids_first():
    pop = whole_builtin("fraud-rare", size=50_000)
    st = prepare_whole(pop, WholeDesign(), ["recall"])
    assert st.positive.tolist() == [True] * 4 + [False] * 4
    assert st.N.sum() == pop.size and st.G.sum() == pop.labels.sum()
    only_precision = prepare_whole(pop, WholeDesign(), ["precision"])
    assert only_precision.positive.all() and only_precision.N.sum() == pop.predicted_positive.sum()


@pytest.mark.slow
def test_simulate_recall_json_and_savings_on_rare_positives(capsys):
    doc = run_json(capsys, "--metric", "recall", "--builtin", "fraud-rare", "--runs", "200", "--delta", "0.05")
    assert doc["metric"] == "recall" and doc["population"] == "fraud-rare"
    assert doc["truth"] == pytest.approx(whole_builtin("fraud-rare").truth("recall"))
    random, default = doc["methods"]
    assert random["method"] == "random" and default["method"] == "opt_track"
    assert default["labels_mean"] < 0.5 * random["labels_mean"]
    assert default["ci_coverage"] > 0.9 and default["change_vs_random"] < -50
    assert doc["floor_stratum_items"] == 500 and 0 < doc["floor_labels"] < default["labels_mean"]


@pytest.mark.slow
def test_simulate_every_method_and_stratification_side_by_side(capsys):
    doc = run_json(capsys, "--metric", "f1", "--builtin", "balanced", "--runs", "20", "--delta", "0.1",
                   "--methods", "opt_track,opt,opt_conf,opt_a2,pps,uni", "--stratifications", "perc,equal",
                   "--negative-stratifications", "perc,cum_sqrt_f")
    assert len(doc["methods"]) == 1 + 6 * 2 * 2
    assert {m["stratification"] for m in doc["methods"][1:]} == {"perc+perc", "perc+cum_sqrt_f", "equal+perc",
                                                                  "equal+cum_sqrt_f"}


def test_margin_strata_hand_case():
    """Kumar & Raj's |margin| strata: z = |score - t| pools both sides, the variable is
    'the prediction was right', the prior the calibrated chance of being right."""
    pop = WholeStream("hand", np.array([-2.0, -1.0, 1.0, 2.0]), np.array([0, 1, 1, 0], np.int8), 0.0)
    st = margin_strata(pop, 2, "perc")  # right = (1, 0, 1, 0); z = (2, 1, 1, 2)
    assert st.N.tolist() == [2, 2] and st.G.tolist() == [1, 1] and st.positive.all()
    # z = 1: 1 - expit(-1) below the threshold, expit(1) above: both expit(1); z = 2 likewise
    assert st.q == pytest.approx([1 / (1 + np.exp(-1)), 1 / (1 + np.exp(-2))])
    assert (st.G.sum() / st.N.sum()) == pop.truth("accuracy")
    assert prepare_whole(pop, WholeDesign(strata=2, margin=True), ["accuracy"]).N.tolist() == [2, 2]


def test_fine_strata_hand_case():
    """Strata of `items` consecutive items by score on each side, positives first, the last one smaller."""
    pop = WholeStream("hand", np.array([0.9, 0.1, 0.6, 0.3, 0.2, 0.8, 0.05]), np.array([1, 0, 0, 1, 0, 1, 1], np.int8),
                      0.5)
    st = fine_strata(pop, items=2)  # positives by score 0.6, 0.8 | 0.9; negatives 0.05, 0.1 | 0.2, 0.3
    assert st.N.tolist() == [2, 1, 2, 2] and st.G.tolist() == [1, 1, 1, 1]
    assert st.positive.tolist() == [True, True, False, False]
    assert st.q == pytest.approx([0.5, 1.0, 0.5, 0.5])


def test_the_floor_of_fine_strata_is_under_the_designs_own_bound():
    """The 500-item floor of issue 51: no more labels than the Neyman bound of the default's 4 + 4 strata,
    and on `abuse-rare-weak` recall (a weak score) well under it."""
    pop = whole_builtin("abuse-rare-weak", size=50_000)
    own = oracle_labels(prepare_whole(pop, WholeDesign(), ["recall"]), "recall", 0.05, 0.95)
    floor = oracle_labels(fine_strata(pop), "recall", 0.05, 0.95)
    assert fine_strata(pop).N.sum() == pop.size
    assert 0.5 * own < floor < 0.85 * own


@pytest.mark.slow
def test_simulate_accuracy_with_margin_strata_beside_the_two_sided_design(capsys):
    doc = run_json(capsys, "--metric", "accuracy", "--builtin", "svm-two-sided", "--runs", "40", "--delta", "0.05",
                   "--margin-strata", "--methods", "opt_track,opt_a1")
    assert [m["stratification"] for m in doc["methods"]] == [
        "none", "perc+cum_sqrt_prior", "perc on |margin|", "perc+cum_sqrt_prior", "perc on |margin|"]
    assert [m["method"] for m in doc["methods"]][3:] == ["opt_a1", "opt_a1"]


def test_simulate_multiclass_accuracy_from_a_file_without_threshold(tmp_path, capsys):
    rng = np.random.default_rng(3)
    conf = 0.2 + 0.8 * rng.random(3000)
    right = rng.random(3000) < conf
    path = tmp_path / "confidence.csv"
    path.write_text("score,label\n" + "".join(f"{c:.5f},{int(r)}\n" for c, r in zip(conf, right)))
    doc = run_json(capsys, "--metric", "accuracy", "--population", str(path), "--runs", "50", "--delta", "0.1")
    assert doc["threshold"] is None and doc["truth"] == pytest.approx(right.mean())


@pytest.mark.slow
def test_precision_on_a_whole_stream_population_is_todays_study(capsys):
    doc = run_json(capsys, "--builtin", "moderation", "--runs", "20", "--delta", "0.1")
    assert doc["truth"] == pytest.approx(whole_builtin("moderation").truth("precision"))
    assert doc["size"] == int(whole_builtin("moderation").predicted_positive.sum())


@pytest.mark.parametrize("args,option", [
    (["--metric", "recall", "--builtin", "calibrated"], "whole-stream population"),
    (["--metric", "f1", "--builtin", "multiclass-confidence"], "not defined"),
    (["--metric", "recall", "--stream", "--scenario", "drift"], "--scenario drift"),
    (["--metric", "recall", "--stream", "--negative-stratifications", "perc"], "--negative-stratifications"),
    (["--metric", "recall", "--budget", "50,x"], "--budget"),
    (["--metric", "recall", "--budget", "1"], "--budget"),
    (["--metric", "recall", "--negative-strata", "0"], "--negative-strata"),
    (["--metric", "recall", "--negative-stratifications", "bogus"], "--negative-stratifications"),
    (["--metric", "recall", "--builtin", "moderation", "--threshold", "0.3"], "--threshold"),
    (["--negative-strata", "6"], "--negative-strata"),
    (["--margin-strata"], "--margin-strata"),
    (["--metric", "recall", "--margin-strata"], "--margin-strata needs --metric accuracy"),
    (["--metric", "accuracy", "--builtin", "multiclass-confidence", "--margin-strata"], "with a threshold"),
    (["--metric", "recall", "--scenario", "slow"], "--scenario"),
])
def test_simulate_metric_errors_name_the_option(args, option, capsys):
    """(`--budget` applies to every metric since issue 47: a wrong list is the error now.)"""
    assert main(["simulate", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("stratameter simulate: error:") and option in err, err


def test_population_file_needs_a_threshold_for_recall(tmp_path, capsys):
    path = tmp_path / "p.csv"
    path.write_text("score,label\n0.9,1\n0.2,0\n0.7,1\n")
    assert main(["simulate", "--metric", "recall", "--population", str(path)]) == 2
    assert "--threshold" in capsys.readouterr().err


@pytest.mark.slow
def test_simulate_stream_with_a_metric_runs_the_stream_design_on_the_whole_stream(capsys):
    assert main(["simulate", "--metric", "recall", "--builtin", "moderation", "--stream", "--scenario", "burst",
                 "--delta", "0.05", "--runs", "40", "--rate", "5", "--json", "--workers", "1"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["metric"] == "recall" and doc["truth"] == pytest.approx(whole_builtin("moderation").truth("recall"))
    cell = doc["scenarios"][0]
    assert cell["reached_delta"] > 0.9 and cell["coverage_closed"] > 0.85
    # the chunk's truth is its own realised recall, near the population's
    assert abs(cell["truth_mean"] - doc["truth"]) < 0.02
    assert doc["static"]["stratification"] == "perc+cum_sqrt_prior"


def test_stream_chunks_have_strata_on_both_sides():
    from stratameter.simulate.arrivals import SCENARIOS, StreamSettings, draw

    pop = whole_builtin("moderation", size=20_000)
    c = draw(pop, SCENARIOS["burst"], StreamSettings(metric="f1", rate=2.0, chunk_seconds=600),
             5, np.random.default_rng(0))
    assert c.K == 8 and c.positive.tolist() == [True] * 4 + [False] * 4
    assert c.target.metrics == ("f1",)
    real = c.stratum < 8
    pred = c.prob >= 0.5  # moderation's scores are probabilities, threshold 0.5
    assert np.array_equal(c.stratum[real] < 4, pred[real])
    with pytest.raises(ValueError, match="drift"):
        draw(pop, SCENARIOS["drift"], StreamSettings(metric="recall"), 2, np.random.default_rng(0))


def test_simulate_metric_budget_mode(capsys):
    """`--metric recall --budget 300,600`: per budget, random then the default design, the MSE over
    the linearised metric's simple-random-sampling variance (`WholeStream.srs_variance`)."""
    doc = run_json(capsys, "--metric", "recall", "--builtin", "moderation", "--runs", "40", "--budget", "600,300")
    assert doc["budget"] == [300, 600]
    pop = whole_builtin("moderation")
    rows = doc["methods"]
    assert [(r["method"], r["budget"]) for r in rows] == [("random", 300), ("opt_track", 300), ("random", 600),
                                                           ("opt_track", 600)]
    for r in rows:
        assert r["srs_variance"] == pytest.approx(pop.srs_variance("recall", r["budget"]))
        assert r["mse_ratio_vs_srs"] == pytest.approx(r["mse"] / r["srs_variance"])
        assert 0 <= r["ci_coverage"] <= 1 and r["no_estimate"] == 0.0
