"""stratameter.config's review groups (issue 52): REVIEW_BUDGET_PER_HOUR, REVIEW_GROUP, REVIEW_WEIGHT,
``$review_groups`` in CLASSIFIERS_CONFIG_FILE (config/overrides.py), `Settings.review_budgets` and
`Settings.group_of`."""

from __future__ import annotations

import orjson
import pytest

from stratameter.config import ClassifierConfig, load_settings
from stratameter.config.overrides import GROUPS_KEY
from stratameter.state.keys import negatives_of
from tests.settings_env import P, env, error_of

FILE = P + "CLASSIFIERS_CONFIG_FILE"

#: the example of docs/reference/configuration.md ("Review groups")
EXAMPLE = {"$review_groups": {"trust-safety": {"budget_per_hour": 2000}, "ads": {"budget_per_hour": 300}},
           "spam-en": {"review_group": "trust-safety", "review_weight": 1.5, "delta": 0.02},
           "fraud": {"review_group": "trust-safety"}}


def with_file(tmp_path, doc, **values: str) -> dict[str, str]:
    path = tmp_path / "classifiers.json"
    path.write_bytes(orjson.dumps(doc))
    return {FILE: str(path), **env(**values)}


# --------------------------------------------------------------------------- the three settings


def test_defaults_share_nothing():
    s = load_settings({})
    assert (s.review_budget_per_hour, s.review_group, s.review_weight) == (0, "default", 1.0)
    assert s.review_budgets == {} and s.group_of("fraud") is None and s.group_of(negatives_of("fraud")) is None
    d = s.defaults()
    assert (d.review_group, d.review_weight) == ("default", 1.0)
    assert "review_budget_per_hour" not in ClassifierConfig.model_fields  # one budget for the service


def test_the_settings_from_the_environment():
    s = load_settings(env(review_budget_per_hour="1500", review_weight="2.5"))
    assert (s.review_budget_per_hour, s.review_group, s.review_weight) == (1500, "default", 2.5)
    assert s.review_budgets == {"default": 1500}
    assert s.group_of("any") == "default" and s.group_of(negatives_of("any")) == "default"
    assert s.for_classifier("any").review_weight == 2.5
    assert s.safe_dict()["review_budgets"] == {"default": 1500}


@pytest.mark.parametrize("name, value, fragment", [
    ("review_budget_per_hour", "-1", "must be >= 0, got -1"),
    ("review_budget_per_hour", "2.5", "must be an integer"),
    ("review_group", "trust safety", "a group name must be 1-128 characters of [A-Za-z0-9._:-]"),
    ("review_group", "{tag}", "(the classifier-id rule), got '{tag}'"),
    ("review_group", "g" * 129, "1-128 characters"),
    ("review_weight", "0", "must be a finite number > 0, got 0"),
    ("review_weight", "-1", "> 0"),
    ("review_weight", "inf", "> 0"),
    ("review_weight", "nan", "> 0"),
    ("review_weight", "heavy", "must be a number"),
])
def test_invalid_values_name_the_variable(name, value, fragment):
    err = error_of(env(**{name: value}))
    assert err.errors[0][0] == P + name.upper(), str(err)
    assert fragment in str(err)


def test_a_named_global_group_must_be_defined(tmp_path):
    err = error_of(env(review_group="moderation"))
    assert err.errors == [(P + "REVIEW_GROUP", "no group 'moderation' (defined: none; groups are defined under "
                                               "'$review_groups' in STRATAMETER_CLASSIFIERS_CONFIG_FILE)")]
    err = error_of(with_file(tmp_path, EXAMPLE, review_group="moderation"))
    assert err.errors == [(P + "REVIEW_GROUP", "no group 'moderation' (defined: trust-safety, ads)")]
    s = load_settings(with_file(tmp_path, EXAMPLE, review_group="ads"))
    assert s.group_of("anyone") == "ads" and s.group_of("spam-en") == "trust-safety"


# --------------------------------------------------------------------------- the file's groups


def test_the_files_groups(tmp_path):
    s = load_settings(with_file(tmp_path, EXAMPLE, delta="0.04"))
    assert s.review_budgets == {"trust-safety": 2000, "ads": 300}
    spam, fraud = s.for_classifier("spam-en"), s.for_classifier("fraud")
    assert (spam.review_group, spam.review_weight, spam.delta) == ("trust-safety", 1.5, 0.02)
    assert (fraud.review_group, fraud.review_weight, fraud.delta) == ("trust-safety", 1.0, 0.04)
    assert s.overridden_classifiers == ("fraud", "spam-en")  # the reserved key is no classifier
    assert s.group_of("spam-en") == "trust-safety" and s.group_of("fraud") == "trust-safety"
    assert s.group_of("other") is None  # "default", without a budget
    assert s.for_classifier("other").review_group == "default"


def test_group_of_a_classifiers_negatives_is_its_own(tmp_path):
    s = load_settings(with_file(tmp_path, {**EXAMPLE, "spam-en": {**EXAMPLE["spam-en"], "metrics": "recall"}},
                                review_budget_per_hour="400"))
    neg = s.for_classifier(negatives_of("spam-en"))
    assert (neg.review_group, neg.review_weight) == ("trust-safety", 1.5)
    assert s.group_of(negatives_of("spam-en")) == "trust-safety" == s.group_of("spam-en")
    assert s.group_of(negatives_of("other")) == "default" == s.group_of("other")


def test_a_classifier_overrides_its_weight(tmp_path):
    s = load_settings(with_file(tmp_path, {"a": {"review_weight": 3}, "b": {"review_weight": 0.25}},
                                review_weight="2", review_budget_per_hour="100"))
    assert [s.for_classifier(c).review_weight for c in ("a", "b", "c")] == [3.0, 0.25, 2.0]
    assert {s.group_of(c) for c in ("a", "b", "c")} == {"default"}


def test_the_default_group_from_the_file_or_the_variable(tmp_path):
    doc = {"$review_groups": {"default": {"budget_per_hour": 800}, "ads": {"budget_per_hour": 300}},
           "ads-ctr": {"review_group": "ads"}, "fraud": {"review_group": "default"}}
    s = load_settings(with_file(tmp_path, doc))
    assert s.review_budgets == {"default": 800, "ads": 300}
    assert (s.group_of("fraud"), s.group_of("other"), s.group_of("ads-ctr")) == ("default", "default", "ads")
    s = load_settings(with_file(tmp_path, EXAMPLE, review_budget_per_hour="500"))
    assert s.review_budgets == {"default": 500, "trust-safety": 2000, "ads": 300}
    err = error_of(with_file(tmp_path, doc, review_budget_per_hour="500"))
    (var, msg), = err.errors
    assert var == FILE and msg.startswith("$review_groups.default: ")
    assert "STRATAMETER_REVIEW_BUDGET_PER_HOUR (500)" in msg and "$review_groups.default.budget_per_hour" in msg


def test_review_budgets_is_a_copy(tmp_path):
    s = load_settings(with_file(tmp_path, EXAMPLE))
    s.review_budgets["trust-safety"] = 1
    assert s.review_budgets["trust-safety"] == 2000


def test_an_empty_groups_object_is_no_group(tmp_path):
    s = load_settings(with_file(tmp_path, {GROUPS_KEY: {}, "fraud": {"delta": 0.01}}))
    assert s.review_budgets == {} and s.overridden_classifiers == ("fraud",)


def test_a_group_that_shares_items(tmp_path):
    """``share_items`` names the groups whose members share items; a classifier outside them, or in
    a group without it, shares nothing (`Settings.sharing_group_of`, its negatives' its own)."""
    doc = {"$review_groups": {"shadows": {"budget_per_hour": 500, "share_items": True},
                              "ads": {"budget_per_hour": 300, "share_items": False}},
           "model": {"review_group": "shadows"}, "shadow": {"review_group": "shadows"}, "ctr": {"review_group": "ads"}}
    s = load_settings(with_file(tmp_path, doc, review_budget_per_hour="100"))
    assert s.sharing_group_of("model") == s.sharing_group_of("shadow") == "shadows"
    assert s.sharing_group_of(negatives_of("shadow")) == "shadows"
    assert s.sharing_group_of("ctr") is None and s.sharing_group_of("other") is None
    assert s.group_of("ctr") == "ads" and s.group_of("other") == "default"


@pytest.mark.parametrize("doc, fragment", [
    ({"$review_groups": {"ads": {"budget_per_hour": 0}}}, "$review_groups.ads.budget_per_hour: must be >= 1, got 0"),
    ({"$review_groups": {"ads": {"budget_per_hour": 2.5}}}, "$review_groups.ads.budget_per_hour: must be an integer"),
    ({"$review_groups": {"ads": {"budget_per_hour": "300"}}},
     "$review_groups.ads.budget_per_hour: must be an integer, got '300'"),
    ({"$review_groups": {"ads": {"budget_per_hour": True}}},
     "$review_groups.ads.budget_per_hour: must be an integer, got true"),
    ({"$review_groups": {"ads": {}}}, "$review_groups.ads.budget_per_hour: required"),
    ({"$review_groups": {"ads": {"budget_per_hour": 3, "weight": 1}}},
     "$review_groups.ads: unknown key(s) 'weight'; allowed: budget_per_hour, share_items"),
    ({"$review_groups": {"ads": {"budget_per_hour": 3, "share_items": "yes"}}},
     "$review_groups.ads.share_items: must be true or false, got 'yes'"),
    ({"$review_groups": {"ads": {"budget_per_hour": 3, "share_items": 1}}},
     "$review_groups.ads.share_items: must be true or false, got 1"),
    ({"$review_groups": {"ads": 300}}, '$review_groups.ads: must be an object {"budget_per_hour": n}, got int'),
    ({"$review_groups": {"trust safety": {"budget_per_hour": 3}}},
     "$review_groups: 'trust safety' is not a group name (1-128 characters of [A-Za-z0-9._:-]"),
    ({"$review_groups": [{"ads": {"budget_per_hour": 3}}]}, "$review_groups: must be an object"),
    ({"spam-en": {"review_group": "x"}}, "spam-en.review_group: no group 'x' (defined: none; groups are defined"),
    ({**EXAMPLE, "spam-en": {"review_group": "x"}}, "spam-en.review_group: no group 'x' (defined: trust-safety, ads)"),
    ({"spam-en": {"review_group": "a b"}}, "spam-en.review_group: a group name must be 1-128 characters"),
    ({"spam-en": {"review_group": 3}}, "spam-en.review_group: must be a string"),
    ({"spam-en": {"review_weight": 0}}, "spam-en.review_weight: must be a finite number > 0, got 0"),
    ({"spam-en": {"review_weight": "1.5"}}, "spam-en.review_weight: must be a number, got '1.5'"),
    ({"spam-en": {"review_budget_per_hour": 10}}, "spam-en: unknown setting(s) 'review_budget_per_hour'"),
    ({"$groups": {}}, "'$groups' is not a classifier id (1-128 characters of [A-Za-z0-9._:-]); the only reserved "
                      "key is '$review_groups'"),
])
def test_invalid_groups_name_their_field(tmp_path, doc, fragment):
    err = error_of(with_file(tmp_path, doc))
    assert str(err).startswith(FILE + ": "), str(err)
    assert fragment in str(err), str(err)


def test_every_error_of_the_file_at_once(tmp_path):
    """A group that is defined but wrong is reported once: not again for the classifiers naming it."""
    doc = {"$review_groups": {"ads": {"budget_per_hour": 0}, "ok": {"budget_per_hour": 5}},
           "ads-ctr": {"review_group": "ads"}, "spam-en": {"review_group": "x", "review_weight": -1},
           "fraud": {"review_group": "ok"}}
    err = error_of(with_file(tmp_path, doc))
    assert [msg.split(":")[0] for _, msg in err.errors] == [
        "$review_groups.ads.budget_per_hour", "spam-en.review_weight", "spam-en.review_group"]
    assert all(var == FILE for var, _ in err.errors)
