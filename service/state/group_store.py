"""The review groups port: a group's shared hourly label budget (GRANT) and its classifiers' chunk
forecasts (issue 52, docs/concepts/shared-budget.md).  A group's keys are in a slot of their own
(``{<group>~group}``, `keys.Keys.group`), so no script touches both a group and a classifier: a
request loop asks GRANT first and then issues at most what it was granted (ISSUE, in the
classifier's slot)."""

from __future__ import annotations

from .connection import StateConnection, text

#: A group's hourly counter outlives its hour by this much (its last grants stay readable).
GRANTED_TTL_MS = 2 * 3_600_000


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
