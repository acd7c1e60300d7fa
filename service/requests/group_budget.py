"""The request loop's side of a review group's shared label budget (issue 52): a thin adapter
around the pure `chunks.group_plan`.  For a chunk of a classifier in a group with a budget
(`Settings.group_of`) each step writes the chunk's forecast beside the group's budget, reads the
group's fresh forecasts, and asks GRANT for the labels `group_plan.labels_to_ask` gives; the loop
issues at most what was granted.  A classifier in no such group keeps its own budget alone."""

from __future__ import annotations

from ..chunks import lifecycle
from ..chunks.group_plan import MemberForecast, fixed_round_room, fresh, labels_to_ask, member_forecast
from ..chunks.plan import ChunkPlan, ChunkSnapshot
from ..state.group_store import GroupStore


class GroupGrants:
    """What the loops of one process ask of their classifiers' review groups."""

    def __init__(self, groups: GroupStore, settings) -> None:
        self.groups, self.settings = groups, settings

    async def labels_for(self, cid: str, snapshot: ChunkSnapshot, plan: ChunkPlan, cfg, now_ms: int, due: int,
                         own_left: int) -> int:
        """The requests chunk `snapshot` of `cid` may issue now with `due` items due and `own_left`
        left in its own hourly budget: `own_left` outside a group, else what its group granted
        (both budgets hold)."""
        group = self.settings.group_of(cid)
        if group is None:
            return own_left
        own = member_forecast(cid, snapshot, plan, cfg, now_ms)
        await self.groups.write_forecast(group, own.member, own.to_json())
        cap = min(due, own_left)
        if cap <= 0:
            return 0
        allowance = lifecycle.allowance_at(self.settings.review_budgets[group], now_ms)
        left = allowance - await self.groups.granted_this_hour(group, now_ms)
        room = fixed_round_room(int(snapshot.N.size), cfg.round_labels_per_stratum, snapshot.pending)
        ask = labels_to_ask(own, await self._fresh(group, now_ms), cap, left, room)
        return await self.groups.grant(group, now_ms, allowance, ask)

    async def _fresh(self, group: str, now_ms: int) -> list[MemberForecast]:
        """The group's fresh forecasts; the stale ones are deleted (`group_plan.FORECAST_TTL_SECONDS`)."""
        stored = {member: MemberForecast.from_json(raw) for member, raw in (await self.groups.forecasts(group)).items()}
        kept = fresh(list(stored.values()), now_ms)
        await self.groups.drop_forecasts(group, sorted(set(stored) - {f.member for f in kept}))
        return kept
