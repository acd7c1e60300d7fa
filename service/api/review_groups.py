"""A review group's shared hourly label budget as an operator sees it (issue 52,
docs/concepts/shared-budget.md): the ``/v1/review-groups`` documents, the figures of the
``stratameter_review_budget_*`` gauges and of the status page, and the group a classifier's own
document names.

Only the groups with a shared budget are shown (`Settings.review_budgets`; a classifier's group is
`Settings.group_of`, None outside such a group).  Their figures are read at request/scrape time:
the labels granted to the group's classifiers in the current clock hour (`GroupStore`, the GRANT
counter), and the paced allowance now in whole seconds into the hour, the rule of the request loop
(`requests.group_budget`) and of a classifier's own ``label_budget_remaining``
(`views._counters_doc`): the three never disagree by a label."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from ..chunks import lifecycle
from ..state.group_store import GroupStore


@dataclass(frozen=True)
class GroupBudget:
    """A review group's budget as it stands at one instant."""

    group: str
    budget_per_hour: int  # configured
    allowed_now: int  # the paced allowance of the clock hour so far
    granted_this_hour: int  # labels granted to its classifiers in the clock hour

    @property
    def remaining(self) -> int:
        """Labels the paced budget allows now beyond those granted this hour."""
        return max(0, self.allowed_now - self.granted_this_hour)


async def group_budgets(groups: GroupStore, settings, now_ms: int) -> dict[str, GroupBudget]:
    """Every group with a shared budget at `now_ms`, by name (sorted); one read a group."""
    budgets = {name: int(b) for name, b in sorted(settings.review_budgets.items())}
    granted = await asyncio.gather(*(groups.granted_this_hour(name, now_ms) for name in budgets))
    return {name: GroupBudget(name, b, lifecycle.allowance_at(b, now_ms), g) for (name, b), g in zip(budgets.items(), granted)}


def member_budget(budgets: dict[str, GroupBudget], settings, cid: str) -> GroupBudget | None:
    """The budget of classifier `cid`'s group (`budgets`: `group_budgets`), None outside a group
    with a shared budget."""
    if not budgets:
        return None
    group = settings.group_of(cid)
    return None if group is None else budgets.get(group)


def group_doc(budget: GroupBudget, classifiers: list[str]) -> dict:
    """The ``/v1/review-groups/{group}`` document: the budget and its `classifiers` (sorted ids)."""
    return {"group": budget.group, "budget_per_hour": budget.budget_per_hour, "allowed_now": budget.allowed_now,
            "granted_this_hour": budget.granted_this_hour, "remaining": budget.remaining,
            "classifiers": sorted(classifiers)}


def group_docs(budgets: dict[str, GroupBudget], settings, classifiers: list[str]) -> list[dict]:
    """Every group's document (sorted by name), each with the known `classifiers` in it."""
    members: dict[str, list[str]] = {name: [] for name in budgets}
    if budgets:
        for cid in classifiers:
            group = settings.group_of(cid)
            if group in members:
                members[group].append(cid)
    return [group_doc(budget, members[name]) for name, budget in budgets.items()]
