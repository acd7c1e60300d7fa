"""`api.review_groups` and the ``/v1/review-groups`` routes, with a stand-in settings object and a
stand-in group store: a group's document by hand (the paced allowance in whole seconds into the
hour, what is left never below 0, its known classifiers), the groups without a shared budget left
out, and a member classifier's ``label_budget_remaining`` capped by its group's."""

from __future__ import annotations

import time

import orjson

from stratameter.api import http, views
from stratameter.api.review_groups import (GroupBudget, group_budgets, group_doc, group_docs,
                                           member_budget)

HOUR_MS = 3_600_000
#: 1,800.999 s into a clock hour: the allowance reads 1,800 whole seconds
NOW_MS = 500_000 * HOUR_MS + 1_800_999


class StandInSettings:
    """The review-group part of `Settings`: `review_budgets` and `group_of`."""

    def __init__(self, budgets: dict[str, int], groups: dict[str, str]) -> None:
        self.review_budgets, self.groups = budgets, groups

    def group_of(self, cid: str) -> str | None:
        return self.groups.get(cid)


class StandInGroups:
    """`GroupStore.granted_this_hour` from a dict, remembering the instants it was asked at."""

    def __init__(self, granted: dict[str, int]) -> None:
        self.granted, self.asked = granted, []

    async def granted_this_hour(self, group: str, now_ms: int) -> int:
        self.asked.append((group, now_ms))
        return self.granted.get(group, 0)


SETTINGS = StandInSettings({"team": 3600, "night": 100}, {"a": "team", "b": "team", "n": "night"})


async def test_each_group_with_a_budget_is_read_at_the_same_instant():
    groups = StandInGroups({"team": 500, "night": 80})
    budgets = await group_budgets(groups, SETTINGS, NOW_MS)
    assert list(budgets) == ["night", "team"]
    assert budgets["team"] == GroupBudget("team", 3600, 1980, 500) and budgets["team"].remaining == 1480
    # night: ceil(100 x 0.55) = 55 allowed, 80 granted (under a larger budget before a restart): 0 left, not -25
    assert budgets["night"].allowed_now == 55 and budgets["night"].remaining == 0
    assert sorted(groups.asked) == [("night", NOW_MS), ("team", NOW_MS)]
    assert await group_budgets(groups, StandInSettings({}, {}), NOW_MS) == {}


def test_a_groups_document_lists_its_known_classifiers():
    budgets = {"night": GroupBudget("night", 100, 55, 10), "team": GroupBudget("team", 3600, 1980, 500)}
    docs = group_docs(budgets, SETTINGS, ["b", "x", "a", "n"])
    assert docs == [
        {"group": "night", "budget_per_hour": 100, "allowed_now": 55, "granted_this_hour": 10, "remaining": 45,
         "classifiers": ["n"]},
        {"group": "team", "budget_per_hour": 3600, "allowed_now": 1980, "granted_this_hour": 500, "remaining": 1480,
         "classifiers": ["a", "b"]},
    ]
    assert group_doc(budgets["team"], [])["classifiers"] == []  # a group none of whose classifiers is known yet
    assert group_docs({}, SETTINGS, ["a"]) == []


def test_a_classifier_outside_a_group_with_a_budget_has_none():
    budgets = {"team": GroupBudget("team", 3600, 1980, 500)}
    assert member_budget(budgets, SETTINGS, "a") is budgets["team"]
    assert member_budget(budgets, SETTINGS, "x") is None
    assert member_budget(budgets, SETTINGS, "n") is None  # its group's budget is not among those read
    assert member_budget({}, SETTINGS, "a") is None


def test_a_members_budget_remaining_is_at_most_its_groups():
    summary = {"pending": 0, "counters": {}, "issued": 100, "meta": {"scores_total": "7"}}

    class Cfg:
        confidence, delta, max_labels_per_hour = 0.95, 0.02, 3600

    now_s = NOW_MS / 1000
    own = views._counters_doc(summary, [], Cfg, now_s, None)
    assert own["review_group"] is None and own["label_budget_remaining"] == 1980 - 100
    tight = views._counters_doc(summary, [], Cfg, now_s, GroupBudget("team", 3600, 1980, 1900))
    assert tight["review_group"] == "team" and tight["label_budget_remaining"] == 80
    loose = views._counters_doc(summary, [], Cfg, now_s, GroupBudget("team", 10_000, 5500, 0))
    assert loose["label_budget_remaining"] == 1880  # its own budget holds too


class StandInService:
    def __init__(self) -> None:
        registry = type("Registry", (), {"classifiers": staticmethod(_classifiers)})()
        self.store = type("Store", (), {"groups": StandInGroups({"team": 2000}), "registry": registry})()
        self.settings = SETTINGS


async def _classifiers() -> list[str]:
    return ["a", "b", "n", "x"]


async def test_the_routes_serve_every_group_and_one(monkeypatch):
    monkeypatch.setattr(time, "time", lambda: NOW_MS / 1000)
    service = StandInService()
    status, body = _parsed(await http.route(service, "GET", "/v1/review-groups"))
    assert status == 200 and [d["group"] for d in body] == ["night", "team"]
    status, body = _parsed(await http.route(service, "GET", "/v1/review-groups/team?x=1"))
    assert status == 200 and body == {"group": "team", "budget_per_hour": 3600, "allowed_now": 1980,
                                      "granted_this_hour": 2000, "remaining": 0, "classifiers": ["a", "b"]}
    status, body = _parsed(await http.route(service, "GET", "/v1/review-groups/n%69ght"))
    assert status == 200 and body["classifiers"] == ["n"]
    status, body = _parsed(await http.route(service, "GET", "/v1/review-groups/default"))
    assert status == 404 and "default" in body["error"]


def _parsed(response: bytes) -> tuple[int, object]:
    head, _, body = response.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), orjson.loads(body)
