"""Tests of `stratameter simulate`: population loading (service/simulate/populations.py),
the built-in populations, and the command end to end (JSON, budget mode, plot,
argument errors).  Runs are few and delta wide so the whole file stays fast."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from stratameter.cli import main
from stratameter.simulate import budget
from stratameter.simulate.populations import BUILTIN, builtin, load

# ---------------------------------------------------------------- populations.load


def write(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_load_csv(tmp_path):
    path = write(tmp_path, "clf.csv", "id,score,label\na,0.9,1\nb,0.55,0\nc,0.7,true\nd,0.8,false\n")
    pop = load(path)
    assert pop.name == "clf"
    assert pop.scores.tolist() == [0.9, 0.55, 0.7, 0.8]
    assert pop.labels.tolist() == [1, 0, 1, 0]
    assert pop.labels.dtype == np.int8
    assert pop.size == 4 and pop.truth == 0.5


def test_load_jsonl_with_blank_lines_and_threshold(tmp_path):
    text = ('{"score": 2.5, "label": 1}\n\n{"score": -1.0, "label": 0}\n'
            '{"score": 0.3, "label": 1.0}\n{"score": 7, "label": false}\n')
    pop = load(write(tmp_path, "m.jsonl", text))
    assert pop.scores.tolist() == [2.5, -1.0, 0.3, 7.0]
    assert pop.labels.tolist() == [1, 0, 1, 0]
    kept = load(write(tmp_path, "m2.jsonl", text), threshold=0.3)
    assert kept.scores.tolist() == [2.5, 0.3, 7.0]  # score >= threshold
    assert kept.labels.tolist() == [1, 1, 0]
    assert kept.truth == pytest.approx(2 / 3)


def csv_after_a_good_row(*rows: str) -> str:
    """A CSV file: the header, one valid row, then `rows`."""
    return "".join(f"{row}\n" for row in ("score,label", "0.9,1", *rows))


@pytest.mark.parametrize("name, text, line, field, value", [
    ("a.csv", csv_after_a_good_row("0.8,2"), 3, "label", "'2'"),
    ("b.csv", csv_after_a_good_row("abc,0"), 3, "score", "'abc'"),
    ("c.csv", csv_after_a_good_row("0.7,1", "nan,0"), 4, "score", "'nan'"),
    ("d.csv", csv_after_a_good_row("inf,0"), 3, "score", "'inf'"),
    ("e.csv", csv_after_a_good_row(",1"), 3, "score", "''"),
    ("f.csv", csv_after_a_good_row("0.8"), 3, "label", "None"),
    ("g.jsonl", '{"score": 0.9, "label": 1}\n{"score": NaN, "label": 0}\n', 2, "score", "nan"),
    ("h.jsonl", '{"score": 0.9, "label": 1}\n\n{"score": 0.7}\n', 3, "label", "None"),
    ("i.jsonl", '{"score": 0.9, "label": 0.5}\n', 1, "label", "0.5"),
    ("j.jsonl", '{"score": "high", "label": 1}\n', 1, "score", "'high'"),
    ("k.jsonl", '{"score": true, "label": 1}\n', 1, "score", "True"),
    ("l.jsonl", '{"label": 1}\n', 1, "score", "None"),
])
def test_load_errors_name_line_and_field(tmp_path, name, text, line, field, value):
    with pytest.raises(ValueError) as err:
        load(write(tmp_path, name, text))
    msg = str(err.value)
    assert f"line {line}:" in msg and f"field '{field}'" in msg and value in msg, msg


def test_load_errors_for_the_whole_file(tmp_path):
    with pytest.raises(ValueError, match="CSV header must contain 'score' and 'label'"):
        load(write(tmp_path, "nolabel.csv", "score,lbl\n0.9,1\n"))
    with pytest.raises(ValueError, match="CSV header must contain"):
        load(write(tmp_path, "empty.csv", ""))
    with pytest.raises(ValueError, match=r":2: not valid JSON"):
        load(write(tmp_path, "bad.jsonl", '{"score": 0.9, "label": 1}\n{"score": 0.9,\n'))
    with pytest.raises(ValueError, match=r":1: each line must be a JSON object"):
        load(write(tmp_path, "list.jsonl", "[0.9, 1]\n"))
    with pytest.raises(ValueError, match="does not exist"):
        load(tmp_path / "missing.csv")
    with pytest.raises(ValueError, match="need at least 2 predicted positives, found 1"):
        load(write(tmp_path, "one.csv", "score,label\n0.9,1\n"))
    with pytest.raises(ValueError, match="found 0"):
        load(write(tmp_path, "high.csv", "score,label\n0.9,1\n0.8,0\n"), threshold=0.95)


# ---------------------------------------------------------------- built-in populations


def test_builtin_populations_are_deterministic_and_varied():
    truths = {}
    for name, (_, _, informative) in BUILTIN.items():
        a, b = builtin(name, size=20_000), builtin(name, size=20_000)
        np.testing.assert_array_equal(a.scores, b.scores)
        np.testing.assert_array_equal(a.labels, b.labels)
        assert a.size == 20_000 and a.name == name and a.informative is informative
        assert np.all(np.isfinite(a.scores)) and set(np.unique(a.labels)) <= {0, 1}
        truths[name] = builtin(name).truth  # the study's default size
    # "precision spans 0.6 to 0.97" (within sampling noise at the edges)
    assert min(truths.values()) == pytest.approx(0.6, abs=0.01)
    assert max(truths.values()) == pytest.approx(0.97, abs=0.01)
    assert all(0.58 <= t <= 0.99 for t in truths.values())
    # probabilities and raw margins/logits are both represented
    assert builtin("svm-margin", 1000).scores.max() > 1.0
    assert 0.0 <= builtin("calibrated", 1000).scores.min() and builtin("calibrated", 1000).scores.max() <= 1.0
    assert not BUILTIN["uninformative"][2]


def test_builtin_seed_changes_the_draw_and_unknown_name_raises():
    a, b = builtin("steep", 5000), builtin("steep", 5000, seed=1)
    assert not np.array_equal(a.scores, b.scores)
    with pytest.raises(ValueError, match="unknown population 'nope'"):
        builtin("nope")


# ---------------------------------------------------------------- the command


def run_json(capsys, *args) -> dict:
    code = main(["simulate", *args, "--json"])
    out = capsys.readouterr().out
    assert code == 0
    return json.loads(out, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))


@pytest.mark.slow
def test_simulate_json_document(capsys):
    code = main(["simulate", "--runs", "50", "--json", "--delta", "0.05"])
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["default"] == {"method": "opt_track", "stratification": "perc"}
    pop = builtin("calibrated")
    assert doc["truth"] == pytest.approx(pop.truth)
    assert doc["population"] == "calibrated" and doc["size"] == pop.size
    assert (doc["delta"], doc["alpha"], doc["runs"], doc["budget"]) == (0.05, 0.05, 50, None)
    assert doc["oracle_labels"] > 0
    methods = doc["methods"]
    assert [(m["method"], m["stratification"]) for m in methods] == [("random", "none"), ("opt_track", "perc")]
    for m in methods:
        for key in ("labels_mean", "labels_se", "in_conf", "change_vs_random", "pct_oracle"):
            assert isinstance(m[key], float) and math.isfinite(m[key]), key
        assert 0.0 <= m["in_conf"] <= 1.0
        assert m["labels_mean"] > 0 and m["labels_se"] >= 0
        assert m["pct_oracle"] == pytest.approx(100 * (m["labels_mean"] / m["oracle_labels"] - 1))
    assert methods[0]["change_vs_random"] == 0.0
    assert methods[1]["change_vs_random"] == pytest.approx(
        100 * (methods[1]["labels_mean"] / methods[0]["labels_mean"] - 1))
    # random sampling stops near z^2 p(1-p)/delta^2 labels
    srs = 1.959964**2 * pop.truth * (1 - pop.truth) / 0.05**2
    assert doc["srs_normal_labels"] == pytest.approx(srs, rel=1e-6)  # the closed form beside random's
    assert 0.5 * srs < methods[0]["labels_mean"] < 2.5 * srs


@pytest.mark.slow
def test_simulate_is_reproducible_for_a_seed(capsys):
    args = ["--runs", "20", "--delta", "0.08", "--seed", "3", "--workers", "1", "--builtin", "steep"]
    assert run_json(capsys, *args) == run_json(capsys, *args)


def test_simulate_budget_mode(capsys):
    # (perc strata: every stratum gets labels within 40; equal-width strata can
    # hold 1% of the items and stay unlabelled, see the null test below)
    doc = run_json(capsys, "--runs", "30", "--budget", "80,40", "--methods", "opt,pps,uni",
                   "--stratifications", "perc,cum_sqrt_f", "--workers", "1")
    assert doc["budget"] == [40, 80]
    designs = [("random", "none"), ("opt", "perc"), ("opt", "cum_sqrt_f"), ("pps", "perc"), ("pps", "cum_sqrt_f"),
               ("uni", "perc"), ("uni", "cum_sqrt_f")]
    for budget, rows in ((40, doc["methods"][:7]), (80, doc["methods"][7:])):
        assert [(r["method"], r["stratification"]) for r in rows] == designs
        for r in rows:
            assert r["budget"] == budget and r["mse"] > 0 and 0 <= r["ci_coverage"] <= 1
            assert r["mse_ratio_vs_random"] == pytest.approx(r["mse"] / rows[0]["mse"])
            assert r["mean_abs_error"] <= math.sqrt(r["mse"]) + 1e-12
            p = doc["truth"]  # the closed form of simple random sampling, with its ratio
            assert r["srs_variance"] == pytest.approx(p * (1 - p) / budget)
            assert r["mse_ratio_vs_srs"] == pytest.approx(r["mse"] / r["srs_variance"])
            assert r["mse_ratio_vs_srs_se"] > 0 and r["bias_se"] > 0 and r["ci_coverage_se"] >= 0
            assert 0 < r["mean_width"] <= 1
        assert rows[0]["mse_ratio_vs_random"] == 1.0


def test_budget_figures_hand_case():
    # three runs, truth 0.5: errors -0.1, 0, +0.2 (one interval misses)
    f = budget.figures([0.4, 0.5, 0.7], [0.3, 0.4, 0.6], [0.6, 0.6, 0.8], 0.5, budget.srs_variance(0.5, 25))
    assert f["srs_variance"] == pytest.approx(0.01)
    assert f["mse"] == pytest.approx(0.05 / 3) and f["mse_ratio_vs_srs"] == pytest.approx(5 / 3)
    sq = np.array([0.01, 0.0, 0.04])
    assert f["mse_ratio_vs_srs_se"] == pytest.approx(sq.std(ddof=1) / math.sqrt(3) / 0.01)
    assert f["bias"] == pytest.approx(0.1 / 3) and f["coverage"] == pytest.approx(2 / 3)
    assert f["mean_width"] == pytest.approx(0.7 / 3)
    # without replacement: (N - n) / (N - 1)
    assert budget.srs_variance(0.2, 10, 101) == pytest.approx(0.016 * 91 / 100)
    assert budget.parse_budgets("400, 100,100") == [100, 400]
    with pytest.raises(ValueError, match="--budget"):
        budget.parse_budgets("100,x")


def test_simulate_budget_too_small_for_the_strata_gives_null_not_nan(capsys):
    # 3 labels cannot reach 4 strata: no estimate, reported as null (valid JSON)
    doc = run_json(capsys, "--runs", "10", "--budget", "3", "--workers", "1")
    row = doc["methods"][1]
    assert row["mse"] is None and row["mse_ratio_vs_random"] is None and row["no_estimate"] == 1.0
    assert doc["methods"][0]["no_estimate"] == 0.0  # random (K=1) always has an estimate


def test_simulate_budget_runs_without_estimate_are_reported_not_dropped(capsys):
    # equal-width strata on steep with opt (random multinomial rounds): some
    # runs have not labelled every stratum at 12 labels: they are counted, and the MSE
    # ratio (which would compare differently selected runs) is withheld
    doc = run_json(capsys, "--builtin", "steep", "--runs", "200", "--budget", "12", "--methods", "opt",
                   "--stratifications", "equal", "--workers", "1")
    base, row = doc["methods"]
    assert base["no_estimate"] == 0.0 and base["mse_ratio_vs_random"] == 1.0
    assert 0.0 < row["no_estimate"] < 1.0
    assert row["mse"] > 0 and row["mse_ratio_vs_random"] is None


@pytest.mark.slow
def test_simulate_without_replacement_terminates_on_a_tiny_population(tmp_path, capsys):
    # 40 items, equal-width strata: uni used to give 0 labels per round forever
    rng = np.random.default_rng(1)
    s = np.concatenate([rng.uniform(0.5, 0.52, 37), [0.9, 0.95, 0.99]])
    path = tmp_path / "tiny.csv"
    path.write_text("score,label\n" + "".join(f"{x},{int(x > 0.51)}\n" for x in s))
    doc = run_json(capsys, "--population", str(path), "--without-replacement", "--methods", "uni",
                   "--stratifications", "equal", "--runs", "20", "--delta", "0.01", "--workers", "1")
    assert all(r["labels_mean"] <= 40 for r in doc["methods"])
    doc = run_json(capsys, "--population", str(path), "--without-replacement", "--methods", "uni",
                   "--stratifications", "equal", "--runs", "20", "--budget", "60", "--workers", "1")
    # everything labelled: exact up to the fpc that never counts a stratum as fully known (54c64fc)
    assert doc["methods"][1]["mse"] == pytest.approx(0.0, abs=1e-6)


@pytest.mark.slow
def test_simulate_population_file_and_table(tmp_path, capsys):
    rng = np.random.default_rng(0)
    s = rng.uniform(0.0, 1.0, 3000)
    y = (rng.random(3000) < s).astype(int)
    path = tmp_path / "pop.csv"
    path.write_text("score,label\n" + "".join(f"{a},{b}\n" for a, b in zip(s, y)))
    doc = run_json(capsys, "--population", str(path), "--threshold", "0.5", "--runs", "20",
                   "--delta", "0.08", "--workers", "1", "--without-replacement")
    assert doc["population"] == "pop"
    assert doc["size"] == int((s >= 0.5).sum())
    assert doc["truth"] == pytest.approx(y[s >= 0.5].mean())
    # the human-readable table
    assert main(["simulate", "--population", str(path), "--runs", "10", "--delta", "0.1", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "pop: 3000 predicted positives" in out and "opt_track" in out and "%Oracle" in out


@pytest.mark.slow
def test_simulate_pure_population_has_no_oracle_ratio(tmp_path, capsys):
    path = tmp_path / "pure.jsonl"
    path.write_text("".join(json.dumps({"score": 0.5 + i / 400, "label": 1}) + "\n" for i in range(200)))
    doc = run_json(capsys, "--population", str(path), "--runs", "5", "--delta", "0.2", "--workers", "1")
    assert doc["oracle_labels"] == 0.0
    assert all(m["pct_oracle"] is None for m in doc["methods"])


@pytest.mark.slow
def test_simulate_plot_writes_a_png(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    png = tmp_path / "study.png"
    assert main(["simulate", "--runs", "20", "--delta", "0.08", "--plot", str(png), "--json", "--workers", "1"]) == 0
    json.loads(capsys.readouterr().out)
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


@pytest.mark.parametrize("args, option", [
    (["--runs", "1"], "--runs"),
    (["--delta", "0.7"], "--delta"),
    (["--delta", "0"], "--delta"),
    (["--alpha", "1.5"], "--alpha"),
    (["--strata", "0"], "--strata"),
    (["--budget", "1"], "--budget"),
    (["--methods", "bogus"], "--methods"),
    (["--methods", "opt,bogus"], "--methods"),
    (["--methods", ","], "--methods"),
    (["--stratifications", "quartiles"], "--stratifications"),
    (["--threshold", "2.0"], "--threshold"),
])
def test_bad_arguments_exit_2_naming_the_option(capsys, args, option):
    assert main(["simulate", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("stratameter simulate: error:") and option in err, err


def test_bad_population_file_exits_2_naming_the_line(tmp_path, capsys):
    path = write(tmp_path, "bad.csv", "score,label\n0.9,1\n0.8,7\n")
    assert main(["simulate", "--population", str(path)]) == 2
    err = capsys.readouterr().err
    assert "line 3" in err and "'label'" in err


@pytest.mark.parametrize("args, option", [
    (["--runs", "many"], "--runs"),
    (["--builtin", "nope"], "--builtin"),
    (["--interval", "wald"], "--interval"),
    (["--builtin", "steep", "--population", "x.csv"], "--population"),
])
def test_argparse_errors_exit_2_naming_the_option(capsys, args, option):
    with pytest.raises(SystemExit) as exc:
        main(["simulate", *args])
    assert exc.value.code == 2
    assert option in capsys.readouterr().err


# ---------------------------------------------------------------- simulate --stream


def test_simulate_stream_json_document(capsys):
    doc = run_json(capsys, "--stream", "--scenario", "burst,slow", "--runs", "20", "--delta", "0.1",
                   "--chunk-seconds", "600", "--rate", "0.5", "--lateness", "60", "--workers", "1")
    assert doc["mode"] == "stream" and doc["population"] == "calibrated" and doc["runs"] == 20
    assert doc["delta"] == 0.1 and doc["confidence"] == 0.95
    assert doc["settings"]["chunk_seconds"] == 600 and doc["settings"]["rate"] == 0.5
    assert doc["settings"]["lateness"] == 60 and doc["settings"]["max_labels_per_hour"] is None
    static = doc["static"]
    assert static["method"] == "opt_track" and static["labels_mean"] > 0
    rows = doc["scenarios"]
    assert [r["scenario"] for r in rows] == ["burst", "slow"]
    for r in rows:
        assert r["runs"] == 20 and 250 <= r["items_mean"] <= 350
        assert 0 <= r["reached_delta"] <= 1 and 0 <= r["coverage_closed"] <= 1
        assert r["ratio_vs_static"] == pytest.approx(r["labels_mean"] / static["labels_mean"])
        assert r["labels_mean"] <= r["requests_mean"] <= r["items_mean"]
    # a scenario's runs depend only on the seed, not on the other scenarios selected
    again = run_json(capsys, "--stream", "--scenario", "slow", "--runs", "20", "--delta", "0.1",
                     "--chunk-seconds", "600", "--rate", "0.5", "--lateness", "60", "--workers", "1")
    assert again["scenarios"][0]["labels_mean"] == rows[1]["labels_mean"]


@pytest.mark.slow
def test_simulate_stream_defaults_and_table(capsys):
    doc = run_json(capsys, "--stream", "--runs", "4", "--chunk-seconds", "300", "--review-delay", "5",
                   "--skip-rate", "0.1", "--max-labels-per-hour", "100", "--confidence", "0.9", "--workers", "1")
    assert doc["delta"] == 0.02 and doc["confidence"] == 0.9  # the service's DELTA by default
    assert [r["scenario"] for r in doc["scenarios"]] == ["slow"]
    assert doc["settings"]["review_delay"] == [5.0, 5.0] and doc["settings"]["skip_rate"] == 0.1
    assert doc["settings"]["max_labels_per_hour"] == 100
    assert main(["simulate", "--stream", "--scenario", "all", "--runs", "3", "--chunk-seconds", "300",
                 "--delta", "0.1", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    for name in ("slow", "burst", "bursts", "drift", "late-answers", "static design", "reached delta"):
        assert name in out


@pytest.mark.parametrize("args, option", [
    (["--rate", "2"], "--rate"),  # stream options need --stream
    (["--scenario", "slow"], "--scenario"),
    (["--max-labels-per-hour", "10"], "--max-labels-per-hour"),
    (["--stream", "--budget", "50"], "--budget"),
    (["--stream", "--methods", "opt"], "--methods"),
    (["--stream", "--without-replacement"], "--without-replacement"),
    (["--stream", "--scenario", "trickle"], "--scenario"),
    (["--stream", "--rate", "0"], "--rate"),
    (["--stream", "--chunk-seconds", "0.5"], "--chunk-seconds"),
    (["--stream", "--review-delay", "30-10"], "--review-delay"),
    (["--stream", "--review-delay", "soon"], "--review-delay"),
    (["--stream", "--skip-rate", "1"], "--skip-rate"),
    (["--stream", "--lateness", "-1"], "--lateness"),
    (["--stream", "--max-labels-per-hour", "0"], "--max-labels-per-hour"),
    (["--alpha", "0.1", "--confidence", "0.9"], "--confidence"),
])
def test_stream_bad_arguments_exit_2_naming_the_option(capsys, args, option):
    assert main(["simulate", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("stratameter simulate: error:") and option in err, err


def test_stream_drift_needs_a_precision_above_the_drop(tmp_path, capsys):
    path = write(tmp_path, "low.csv", "score,label\n" + "".join(f"{0.5 + i / 200},{int(i % 10 == 0)}\n"
                                                              for i in range(100)))
    assert main(["simulate", "--stream", "--population", str(path), "--scenario", "slow,drift", "--runs", "3"]) == 2
    err = capsys.readouterr().err
    assert "--scenario drift" in err and "0.100" in err


def test_simulate_targets_the_services_default_delta():
    from stratameter.config.settings import Settings
    from stratameter.simulate.options import DEFAULT_DELTA

    assert DEFAULT_DELTA == Settings.model_fields["delta"].default
