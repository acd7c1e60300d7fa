"""Fold reviewers' answers into the stratum counts, each exactly once.

A request id is ``<classifier_id>/<random token>``: the classifier part routes
the answer to the classifier's state (one Redis slot) without any global
index; the 128-bit token makes ids unguessable, so a label cannot be forged
for an item that was never requested.  The LABEL script checks and consumes
the outstanding request and updates the counts in one atomic call, guarded by
the labels-partition offset (replays are no-ops).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from stratameter.schemas.messages import is_classifier_id

from ..state.calls import LabelCall
from ..state.keys import owner_of
from ..state.offsets import Acknowledged, RestartedLogs, StateRolledBack
from ..state.request_store import RequestStore


def split_request_id(rid: str) -> str | None:
    """The state a request id belongs to (a classifier, or its predicted negatives:
    `state.keys.negatives_of`), or None if it names none."""
    sid, sep, token = rid.partition("/")
    if not sep or not token or not is_classifier_id(owner_of(sid)[0]):
        return None
    return sid


@dataclass
class LabelOutcome:
    index: int  # position in the batch
    classifier_id: str  # "" when the request id names no classifier (counted service-wide by the caller)
    outcome: str  # one of OUTCOMES, or "replay" (already applied before a restart)
    chunk: int | None = None
    stratum: int | None = None


class LabelFolder:
    """Folds label batches through LABEL (`state.request_store.RequestStore.apply_labels`)."""

    def __init__(self, requests: RequestStore) -> None:
        self.requests = requests
        self._restarted = RestartedLogs("labels")
        self.acknowledged = Acknowledged("labels")  # (state, partition) -> the offset LABEL last applied for us

    def forget_partition(self, partition) -> None:
        """Drop what was seen applied on a partition this instance no longer owns."""
        self.acknowledged.forget_partition(partition)

    async def apply(self, partition: int, offsets, request_ids, labels, labelers,
                    log_end: int | None = None) -> list[LabelOutcome]:
        """Fold a parsed batch; returns one outcome per record.  `log_end`: the partition's end
        offset as its fetch reported it (a replay from a log that started again, `state.offsets`).

        Request ids that name no classifier, or one with no state (made up),
        cannot be routed to any state and are reported as ``unknown`` with
        classifier ``""`` for the caller to count under the global offset guard.
        """
        now_ms = int(time.time() * 1000)
        calls, where, out = [], [], []
        for i, (off, rid, label, who) in enumerate(zip(offsets, request_ids, labels, labelers)):
            cid = split_request_id(rid)
            if cid is None:
                out.append(LabelOutcome(i, "", "unknown"))
                continue
            value = "null" if label is None else ("1" if label else "0")
            calls.append(LabelCall(cid, partition, int(off), rid, value, now_ms, who or ""))
            where.append(i)
        if calls:
            for i, call, reply in zip(where, calls, await self.requests.apply_labels(calls, self.acknowledged)):
                cid, outcome = call.state_id, reply.outcome
                if outcome == "rolled_back":
                    raise StateRolledBack(f"classifier {cid!r}, labels partition {partition}", reply.stored_offset,
                                          self.acknowledged[(cid, partition)])
                if outcome == "no_state":  # a made-up classifier part: no state, no key created
                    out.append(LabelOutcome(i, "", "unknown"))
                    continue
                if outcome == "replay":  # with the offset the state applied
                    self._restarted.check(cid, partition, reply.stored_offset, log_end)
                    out.append(LabelOutcome(i, cid, outcome))
                    continue
                self.acknowledged.note(cid, partition, call.offset)
                out.append(LabelOutcome(i, cid, outcome, reply.chunk, reply.stratum))
        out.sort(key=lambda o: o.index)
        return out
