"""The fleet file of `stratameter simulate --fleet` (`simulate.fleet_spec`): what it reads, and an
error naming the field for what it cannot."""

from __future__ import annotations

from pathlib import Path

import pytest

from stratameter.simulate.fleet_spec import FleetFileError, Member, load_fleet, parse_fleet

ROOT = Path(__file__).resolve().parents[2]


def one(**kw) -> dict:
    return {"name": "spam", "population": "steep", "items_per_hour": 20000, "delta": 0.02, **kw}


def test_the_repository_fleet_file_reads_as_six_classifiers_at_half_their_need():
    spec = load_fleet(ROOT / "examples" / "fleet.toml")
    assert len(spec.members) == 6 and spec.budget_share_of_need == 0.5 and spec.budget_per_hour is None
    assert len({m.population for m in spec.members}) == 6
    assert len({m.items_per_hour for m in spec.members}) == 6


def test_a_fleet_reads_its_defaults():
    spec = parse_fleet({"budget_per_hour": 900, "classifier": [one()]})
    assert spec.members == (Member("spam", "steep", 20000, 0.02, 1.0),)
    assert (spec.budget_per_hour, spec.budget_share_of_need, spec.hours) == (900, None, 1)


@pytest.mark.parametrize(("doc", "names"), [
    ({"classifier": [one()]}, "exactly one of budget_per_hour and budget_share_of_need"),
    ({"budget_per_hour": 9, "budget_share_of_need": 0.5, "classifier": [one()]}, "exactly one of"),
    ({"budget_per_hour": 0, "classifier": [one()]}, "budget_per_hour must be a positive integer"),
    ({"budget_per_hour": 9, "budget": 3, "classifier": [one()]}, "unknown field 'budget'"),
    ({"budget_per_hour": 9}, "no [[classifier]] table"),
    ({"budget_per_hour": 9, "hours": 0, "classifier": [one()]}, "hours must be an integer >= 1"),
    ({"budget_per_hour": 9, "classifier": [one(population="nope")]},
     "classifier 1: population must be a precision population: one of"),
    ({"budget_per_hour": 9, "classifier": [one(metrics="recall")]},
     "classifier 1: population must be a whole-stream population (its metrics need the predicted negatives)"),
    ({"budget_per_hour": 9, "classifier": [one(metrics="recall,auc")]}, "classifier 1: metrics must be a comma list"),
    ({"budget_per_hour": 9, "classifier": [one(), one()]}, "names must be unique"),
    ({"budget_per_hour": 9, "classifier": [one(items_per_hour=10)]}, "items_per_hour must be an integer >= 100"),
    ({"budget_per_hour": 9, "classifier": [one(delta=0.7)]}, "delta must be in (0, 0.5)"),
    ({"budget_per_hour": 9, "classifier": [one(weight=0)]}, "weight must be > 0"),
    ({"budget_per_hour": 9, "classifier": [one(volume=3)]}, "classifier 1: unknown field 'volume'"),
    ({"budget_per_hour": 9, "classifier": [{"name": "x"}]}, "classifier 1: missing field 'delta'"),
])
def test_a_bad_fleet_is_refused_naming_the_field(doc, names):
    with pytest.raises(FleetFileError) as err:
        parse_fleet(doc, "f.toml")
    assert names in str(err.value) and str(err.value).startswith("f.toml")


def test_a_file_that_is_not_toml_names_the_file(tmp_path):
    bad = tmp_path / "fleet.toml"
    bad.write_text("budget_per_hour = [\n")
    with pytest.raises(FleetFileError, match="fleet.toml"):
        load_fleet(bad)
