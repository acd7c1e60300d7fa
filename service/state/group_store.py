"""The review groups port: a group's shared hourly label budget (GRANT), its classifiers' chunk
forecasts, and, in a group that shares items, each item's first request (CLAIM) (issue 52,
docs/concepts/shared-budget.md).  A group's keys are in a slot of their own
(``{<group>~group}``, `keys.Keys.group`), so no script touches both a group and a classifier: a
request loop asks GRANT first and then issues at most what it was granted (ISSUE, in the
classifier's slot)."""

from __future__ import annotations

from dataclasses import dataclass

from .connection import StateConnection, text

#: A group's hourly counter outlives its hour by this much (its last grants stay readable).
GRANTED_TTL_MS = 2 * 3_600_000


@dataclass(frozen=True, slots=True)
class ItemClaim:
    """One item a request loop wants: the request id it would issue, and whether it may only join
    another member's request (it was budgeted as free) rather than become the item's first."""

    item_id: str
    request_id: str
    join_only: bool = False


class GroupStore:
    """Review groups: what each hour granted, and the forecasts the allocation reads."""

    def __init__(self, connection: StateConnection) -> None:
        self.connection, self.keys, self.redis = connection, connection.keys, connection.redis

    async def grant(self, group: str, now_ms: int, allowance: int, ask: int) -> int:
        """Labels granted of the `ask`ed: at most what the paced `allowance` of the clock hour of
        `now_ms` has left (GRANT, atomic)."""
        if ask <= 0:
            return 0
        key = self.keys.group_granted(group, now_ms // 3_600_000)
        return int(await self.connection.scripts.call("GRANT", [key], [allowance, ask, GRANTED_TTL_MS]))

    async def granted_this_hour(self, group: str, now_ms: int) -> int:
        """Labels granted to the group in the clock hour of `now_ms`."""
        v = await self.redis.get(self.keys.group_granted(group, now_ms // 3_600_000))
        return int(v) if v is not None else 0

    async def write_forecast(self, group: str, member: str, forecast: bytes) -> None:
        await self.redis.hset(self.keys.group_forecasts(group), member, forecast)

    async def forecasts(self, group: str) -> dict[str, bytes]:
        """Every forecast of the group, by member (``<cid>/<chunk>``)."""
        raw = await self.redis.hgetall(self.keys.group_forecasts(group))
        return {text(k): v for k, v in raw.items()}

    async def drop_forecasts(self, group: str, members: list[str]) -> None:
        if members:
            await self.redis.hdel(self.keys.group_forecasts(group), *members)

    async def first_requests(self, group: str, item_ids: list[str]) -> list[str | None]:
        """The first request of each item a member of the group asked for, if it has not expired."""
        if not item_ids:
            return []
        return [text(v) for v in await self.redis.mget([self.keys.group_item(group, i) for i in item_ids])]

    async def claim(self, group: str, state_id: str, deadline_ms: int, wanted: list[ItemClaim]) -> list[str]:
        """CLAIM the items of `wanted` for state `state_id`'s requests, due by `deadline_ms`: per item, the
        request of another state it joins, else ``""`` (the item's first request: publish it) or, for a
        claim that may only join (`ItemClaim.join_only`), ``"-"`` (issue nothing)."""
        if not wanted:
            return []
        keys = [self.keys.group_item(group, w.item_id) for w in wanted]
        args = [f"{state_id}/", deadline_ms] + [f"{'j' if w.join_only else 'c'}{w.request_id}" for w in wanted]
        return [text(v) or "" for v in await self.connection.scripts.call("CLAIM", keys, args)]
