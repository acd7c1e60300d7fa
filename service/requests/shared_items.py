"""One label request for every member of a review group that wants the item (issue 52, a group with
``share_items``; docs/concepts/shared-budget.md): the request loop's side, a thin adapter around
CLAIM (the group's slot) and ISSUE and LABEL (the member's).

The members draw an item's priority from its id (`ingest.priorities`), so they want the same items
as far as their thresholds allow.  Before issuing, a member CLAIMs its items in the group's slot:
an item no other member has asked for becomes the item's first request and is published as usual;
an item another member has asked for is **joined**: ISSUE records the member's own request (its
stratum, its threshold, its deadline) as ``joined`` and never publishes it, and it costs neither
budget (`free`: the loop counts it outside the group's grant and the classifier's own hourly
budget).  Each step `resolve` reads the request each joined request joined: once it is answered
(or skipped) the same answer is folded into the joined request by LABEL without an offset (the
joined request's own state is the guard, so a replayed resolve folds nothing twice).  A joined
request whose first is never answered expires at its own deadline and is replaced, as any.

A crash between CLAIM and ISSUE leaves a claim no request was recorded for: members joining it wait
for their deadline, and the member replaces its own claim when it asks for the item again."""

from __future__ import annotations

import orjson

from ..labels.folder import split_request_id
from ..state.calls import LabelCall
from ..state.group_store import ItemClaim
from ..state.store import Store

#: CLAIM's entry for a join-only claim that found no request to join: nothing is issued for it
NOT_ISSUED = "-"
#: A classifier whose last resolve left more than `FEW_JOINS` joined requests waiting is resolved at
#: most every `RESOLVE_EVERY_MS` (the request loop steps every quarter second or more often): each
#: resolve reads every join's first request, so thousands of joins awaiting slow reviewers would
#: otherwise cost the loop much of each pass; with few, every step resolves (docs/concepts/
#: shared-budget.md, "Shared items": what resolving costs).
RESOLVE_EVERY_MS = 2_000
FEW_JOINS = 100


class SharedItems:
    """The items a request loop shares with the other members of its classifiers' review groups."""

    def __init__(self, store: Store, settings) -> None:
        self.groups, self.requests, self.settings = store.groups, store.requests, settings

    async def free(self, cid: str, due: list[tuple]) -> list[bool]:
        """Per due item (``(urgency, state id, stratum, member JSON)``, `requests.due`) of `cid`,
        whether another member of its group already asked for it: joining that request costs no
        label.  All False outside a group that shares items."""
        group = self.settings.sharing_group_of(cid)
        if group is None or not due:
            return [False] * len(due)
        firsts = await self.groups.first_requests(group, [orjson.loads(d[3])["i"] for d in due])
        return [first is not None and split_request_id(first) != d[1] for d, first in zip(due, firsts)]

    async def claim(self, sid: str, deadline_ms: int, wanted: list[ItemClaim]) -> dict[str, str]:
        """CLAIM `wanted` (state `sid`'s requests due by `deadline_ms`): request id -> ``""`` (publish
        it), the request it joins, or `NOT_ISSUED`.  Empty outside a group that shares items."""
        group = self.settings.sharing_group_of(sid)
        if group is None or not wanted:
            return {}
        replies = await self.groups.claim(group, sid, deadline_ms, wanted)
        return {w.request_id: reply for w, reply in zip(wanted, replies)}

    async def resolve(self, sid: str, now_ms: int) -> int:
        """Fold into state `sid`'s joined requests the answers (or skips) their first requests got;
        returns the joins still waiting.  Nothing outside a group that shares items.

        A join whose first request has expired or is gone is dropped without a fold: no answer will
        come, and the joined request expires at its own deadline (EXPIRE) and is replaced.  A joined
        request no longer ``joined`` when its first is answered (it expired, or took the answer
        before a crash) is left as it is (LABEL's ``resolved``), and its join dropped.  The cost is
        a read of each join's first request (`RESOLVE_EVERY_MS`)."""
        if self.settings.sharing_group_of(sid) is None:
            return 0
        joins = await self.requests.joins(sid)
        if not joins:
            return 0
        rids = list(joins)
        firsts = await self.requests.request_fields([(split_request_id(joins[rid]), joins[rid]) for rid in rids],
                                                    "state", "label", "labeler")
        calls = [LabelCall(sid, "", 0, rid, label if state == "answered" else "null", now_ms, labeler or "")
                 for rid, (state, label, labeler) in zip(rids, firsts) if state in ("answered", "skipped")]
        if calls:
            await self.requests.apply_labels(calls)
        done = [rid for rid, (state, _, _) in zip(rids, firsts) if state not in ("new", "pending")]
        await self.requests.drop_joins(sid, done)
        return len(rids) - len(done)
