"""`stratameter simulate --fleet` (`simulate.fleet`, `fleet_command`): the chunks, the splits, the
budget never overspent, and the repository's fleet file as issue 52 measures it (marked slow)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from stratameter import cli
from stratameter.chunks.lifecycle import budget_allowance
from stratameter.simulate import engine, fleet, fleet_chunks, fleet_command
from stratameter.simulate.populations import builtin
from stratameter.simulate.fleet_spec import load_fleet, parse_fleet

ROOT = Path(__file__).resolve().parents[2]
SMALL = parse_fleet({"budget_per_hour": 600, "classifier": [
    {"name": "a", "population": "steep", "items_per_hour": 20000, "delta": 0.02},
    {"name": "b", "population": "flat", "items_per_hour": 5000, "delta": 0.03},
    {"name": "c", "population": "uninformative", "items_per_hour": 1000, "delta": 0.05, "weight": 2.0},
]})


def test_a_chunk_holds_its_items_at_its_population_s_rates():
    t = fleet_chunks.chunk_truth(SMALL.members[1])
    assert t.N.sum() == 5000 and t.N.size == 4
    assert abs(t.truth - engine.prepare(builtin("flat"), engine.Design()).truth) < 0.002


def test_a_recall_classifier_s_chunk_holds_both_sides():
    """`moderation` for recall and F1: 4 positive and 4 negative strata of 10,000 items together,
    its truth its first metric's (recall: the positives above the threshold over all positives)."""
    spec = parse_fleet({"budget_per_hour": 100, "classifier": [
        {"name": "m", "population": "moderation", "items_per_hour": 10000, "delta": 0.05, "metrics": "recall,f1"}]})
    t = fleet_chunks.chunk_truth(spec.members[0])
    assert t.N.sum() == 10000 and t.positive.tolist() == [True] * 4 + [False] * 4
    assert t.truth == pytest.approx(t.G[t.positive].sum() / t.G.sum())
    assert t.metrics == ("recall", "f1") and not t.precision_only


def test_the_splits_share_the_budget_exactly():
    """600 equally: 200 each; by volume 20000 : 5000 : 1000 of 600 = 461.5, 115.4, 23.1 -> 462, 115, 23."""
    assert fleet.own_budgets(SMALL.members, 600, "equal").tolist() == [200, 200, 200]
    assert fleet.own_budgets(SMALL.members, 600, "volume").tolist() == [462, 115, 23]
    with pytest.raises(ValueError, match="equal or volume"):
        fleet.own_budgets(SMALL.members, 600, "shared")


@pytest.mark.parametrize("strategy", fleet.STRATEGIES)
def test_no_strategy_spends_more_than_the_budget(strategy):
    """Counted per run at the end of the hour: the shared budget, and under a split each
    classifier's own; the last step's allowance is at most the whole budget."""
    truths = [fleet_chunks.chunk_truth(m) for m in SMALL.members]
    r = fleet.run_hour(SMALL, truths, 600, strategy, 200, np.random.default_rng(1))
    assert r.labels.sum(axis=1).max() <= 600
    if strategy not in ("shared", "asks"):
        assert (r.labels <= fleet.own_budgets(SMALL.members, 600, strategy)).all()
    assert int(budget_allowance(600, 3540.0)) <= 600
    assert (r.labels >= 8).all()  # every classifier had its warm-up: none starved of an interval


def test_a_bad_fleet_file_exits_2_naming_the_field(tmp_path, capsys):
    bad = tmp_path / "fleet.toml"
    bad.write_text('budget_per_hour = 9\n[[classifier]]\nname = "a"\npopulation = "steep"\nitems_per_hour = 5\n'
                   'delta = 0.02\n')
    assert cli.main(["simulate", "--fleet", str(bad)]) == 2
    assert "classifier 1: items_per_hour must be an integer >= 100" in capsys.readouterr().err


def test_the_command_prints_the_json_document(tmp_path, capsys):
    small = tmp_path / "fleet.toml"
    small.write_text('budget_share_of_need = 0.5\n[[classifier]]\nname = "a"\npopulation = "steep"\n'
                     'items_per_hour = 2000\ndelta = 0.05\n')
    assert cli.main(["simulate", "--fleet", str(small), "--runs", "50", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["strategies"]) == set(fleet.STRATEGIES) and doc["classifiers"][0]["name"] == "a"
    assert doc["budget_per_hour"] == round(0.5 * doc["need_alone"])


@pytest.mark.slow
def test_the_shared_budget_lowers_the_worst_ratio_and_every_interval_covers():
    """The repository's fleet (six populations, budget half their need), 2000 runs: the worst weighted
    half-width ratio at the end of the hour <= 0.8 x an equal split's (0.65 measured), the service's
    way of spending it (each classifier asking for its own share in turn) within 5 % of the fleet's
    one allocation (1.00 measured), every
    classifier's interval covers its chunk's precision >= 0.93 under every strategy (s.e. 0.005 at
    0.95), and a classifier the budget cannot bring to its delta says so (waiting_for_budget)."""
    doc = fleet_command.study(load_fleet(ROOT / "examples" / "fleet.toml"), 2000, 0, 0.95)
    assert doc["shared_vs_equal"] <= 0.8, doc["shared_vs_equal"]
    assert doc["asks_vs_shared"] <= 1.05, doc["asks_vs_shared"]
    assert abs(doc["budget_per_hour"] - 0.5 * doc["need_alone"]) <= 1
    for strategy, s in doc["strategies"].items():
        assert s["labels"] <= doc["budget_per_hour"]
        for row in s["classifiers"]:
            assert row["coverage"] >= 0.93, (strategy, row)
            assert row["converged"] + row["waiting_for_budget"] == pytest.approx(1.0)
    json.dumps(doc)  # the --json document


@pytest.mark.slow
def test_a_fleet_of_precision_and_recall_classifiers_shares_its_budget_too():
    """`examples/fleet-mixed.toml` (precision; precision, recall and F1; recall on rare positives;
    accuracy), 2000 runs: shared <= 0.8 x the equal split (0.44 measured), asks within 5 % of the
    one allocation, every classifier's first metric covered >= 0.93 (0.947 or more measured)."""
    doc = fleet_command.study(load_fleet(ROOT / "examples" / "fleet-mixed.toml"), 2000, 0, 0.95)
    assert doc["shared_vs_equal"] <= 0.8 and doc["asks_vs_shared"] <= 1.05, doc
    for strategy, s in doc["strategies"].items():
        assert s["labels"] <= doc["budget_per_hour"]
        assert all(row["coverage"] >= 0.93 for row in s["classifiers"]), (strategy, s["classifiers"])

