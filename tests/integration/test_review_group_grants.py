"""GRANT against a real Redis (`state.group_store`): a review group's grants never exceed its
paced allowance, however many request loops ask at once; each clock hour counts apart and its
counter expires."""

from __future__ import annotations

import asyncio

import pytest

pytestmark = pytest.mark.integration

HOUR_MS = 3_600_000


async def test_concurrent_asks_never_exceed_the_allowance(store):
    """Forty loops ask 7 labels each of an allowance of 100: 14 get 7, one gets the 2 left, the
    others nothing, and the hour has granted exactly 100."""
    now = 10 * HOUR_MS + 5
    got = await asyncio.gather(*(store.groups.grant("g", now, 100, 7) for _ in range(40)))
    assert sum(got) == 100 and sorted(got, reverse=True)[:15] == [7] * 14 + [2]
    assert await store.groups.granted_this_hour("g", now) == 100
    assert await store.groups.grant("g", now, 100, 1) == 0
    assert await store.groups.grant("g", now, 130, 50) == 30  # the allowance grew over the hour


async def test_each_hour_and_group_counts_apart_and_expires(store):
    now = 20 * HOUR_MS
    assert await store.groups.grant("g", now - 1, 10, 10) == 10
    assert await store.groups.grant("g", now, 10, 4) == 4  # a new hour
    assert await store.groups.grant("other", now, 10, 10) == 10
    assert await store.groups.granted_this_hour("g", now) == 4
    ttl = await store.redis.pttl(store.keys.group_granted("g", now // HOUR_MS))
    assert 2 * HOUR_MS - 60_000 < ttl <= 2 * HOUR_MS
    assert await store.groups.grant("g", now, 10, 0) == 0


async def test_forecasts_are_kept_by_member_and_dropped(store):
    await store.groups.write_forecast("g", "a/1", b"x")
    await store.groups.write_forecast("g", "b/1", b"y")
    await store.groups.write_forecast("g", "a/1", b"z")
    assert await store.groups.forecasts("g") == {"a/1": b"z", "b/1": b"y"}
    await store.groups.drop_forecasts("g", ["a/1"])
    assert await store.groups.forecasts("g") == {"b/1": b"y"}
