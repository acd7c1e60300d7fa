"""The request loop's side of a review group's budget (`requests.group_budget.GroupGrants`) against
a real Redis and a Redis Cluster: the forecasts each chunk writes, the share each asks, GRANT.  How a
budget is split across the members of a group, step by step, with the clock held still."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from stratameter.chunks import group_plan
from stratameter.requests.group_budget import GroupGrants
from stratameter.state.store import Store

pytestmark = pytest.mark.integration

HOUR_MS = 3_600_000


@pytest.fixture
async def store(redis_backend, unique_name):
    """A `Store` on a single Redis and on a Redis Cluster (the group's keys in their own slot)."""
    redis = redis_backend.client()
    try:
        yield Store(redis, unique_name("groups"))
    finally:
        await redis.aclose()
TOP_OF_HOUR = 500_000 * HOUR_MS  # the paced allowance is a tenth of the budget: 100 of 1,000


class Settings:
    """The two reads `GroupGrants` makes of the settings: every classifier in group "g"."""

    review_budgets = {"g": 1000}

    @staticmethod
    def group_of(cid: str) -> str | None:
        return None if cid.startswith("solo") else "g"


def chunk(halfwidth: float, labels: int = 50, pending: int = 0, t: int = 500_000):
    """A chunk of 10,000 items in 4 strata as the loop's snapshot and plan show it."""
    n = np.full(4, labels / 4)
    snapshot = SimpleNamespace(chunk=t, n=n, N=np.full(4, 2500.0), pending=pending, final_size=10_000.0,
                               capacity=np.full(4, 1024.0))
    return snapshot, SimpleNamespace(halfwidth=halfwidth)


def cfg(weight: float = 1.0):
    return SimpleNamespace(delta=0.02, review_weight=weight, round_labels_per_stratum=2)


async def ask(grants: GroupGrants, cid: str, halfwidth: float, due: int, now: int = TOP_OF_HOUR, weight: float = 1.0,
              own_left: int = 10_000, **chunk_args) -> int:
    snapshot, plan = chunk(halfwidth, **chunk_args)
    return await grants.labels_for(cid, snapshot, plan, cfg(weight), now, due, own_left)


async def test_the_budget_goes_where_the_weighted_ratio_is_largest(store):
    """Three chunks alike, hw 0.1 on 50 labels (ratio 5), `a` weighed 1.5 (7.5).  Each writes its
    forecast (a step with nothing due); then each asks for 200 in turn, writing its forecast again
    with its grant out as requests (its next step).  The allocation of the 100 the budget allows:
    at the level L all three reach, 50 (56.25 / L^2 - 1) + 2 x 50 (25 / L^2 - 1) = 100, L^2 = 21.25
    (less the finite population correction), so `a` gets 50 x 1.647 = 82 and `b`, `c` 9 each."""
    grants = GroupGrants(store.groups, Settings())
    for cid, weight in (("a", 1.5), ("b", 1.0), ("c", 1.0)):
        assert await ask(grants, cid, 0.1, due=0, weight=weight) == 0
    assert sorted(await store.groups.forecasts("g")) == ["a/500000", "b/500000", "c/500000"]
    got = {}
    for cid, weight in (("b", 1.0), ("a", 1.5), ("c", 1.0)):
        got[cid] = await ask(grants, cid, 0.1, due=200, weight=weight)
        await ask(grants, cid, 0.1, due=0, weight=weight, pending=got[cid])
    assert 81 <= got["a"] <= 83 and 8 <= got["b"] <= 10 and 8 <= got["c"] <= 10 and sum(got.values()) <= 100
    assert await store.groups.granted_this_hour("g", TOP_OF_HOUR) == sum(got.values())
    assert await ask(grants, "b", 0.1, due=200, pending=got["b"]) == 100 - sum(got.values())  # what rounding left


async def test_a_fixed_round_asks_one_round_and_a_classifier_outside_a_group_its_own(store):
    grants = GroupGrants(store.groups, Settings())
    assert await ask(grants, "warm", math.inf, due=60, labels=0) == 8  # no interval yet: the warm-up round
    assert await ask(grants, "warm", math.inf, due=60, labels=0, pending=8) == 0  # until it is answered
    assert await ask(grants, "near", 0.015, due=60, pending=3) == 5  # within delta: a confirming round
    assert await ask(grants, "poor", 0.1, due=60, own_left=4) == 4  # its own budget holds too
    assert await ask(grants, "solo-1", 0.1, due=60, own_left=37) == 37  # no group: its own budget alone
    assert not await store.groups.forecasts("solo-1")


async def test_a_forecast_not_rewritten_is_left_out_and_deleted(store):
    """`old` wrote its forecast more than `FORECAST_TTL_SECONDS` ago: `new` asks alone, and `old`'s
    forecast is gone."""
    grants = GroupGrants(store.groups, Settings())
    assert await ask(grants, "old", 0.5, due=0, now=TOP_OF_HOUR - 1) == 0
    later = TOP_OF_HOUR + group_plan.FORECAST_TTL_SECONDS * 1000
    assert await ask(grants, "new", 0.1, due=40, now=later) == 40
    assert sorted(await store.groups.forecasts("g")) == ["new/500000"]
