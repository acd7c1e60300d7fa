"""What a scrape remembers of closed chunks: a window pools the reported chunk and up to
``HISTORY_CHUNKS`` chunks before it (`chunks.window`), and reading every one of them whole at every
scrape made a scrape several times dearer.  A closed chunk's items no longer change (no score
reaches it) and its labels only grow (an answer folded by LABEL adds to ``n``, and to ``h`` only
with it), so a closed chunk read before is still current while its label counts and its status are
(the request loop may yet find it converged, which a window reads, `chunks.window`): one small read
a chunk (`ChunkStore.label_counts`) instead of five, and the whole chunk again only once a label
came or the status changed.  And not even that while the state's counters say no label was folded
and no status moved since the chunk was last found current (`label_mark`: LABEL is the only writer
of a chunk's label counts, and it counts every answer it folds and stamps its time in the same call;
EVALUATE_ROUND and SET_STATUS count every change of a closed chunk's status), so a scrape of a
classifier no answer reached reads none of its closed chunks.  Process-local and bounded
(`CACHED_CHUNKS`, least recently used out first; `CACHED_CHUNKS` states' marks)."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from ..state.chunk_store import ChunkStore
from ..state.records import ChunkState, stratum_vector

#: closed chunks remembered (one entry a state and chunk: its counts per stratum)
CACHED_CHUNKS = 100_000


def label_mark(counters: dict[str, str]) -> tuple[str | None, str | None, str | None]:
    """What a state's counters (`ChunkStore.overviews`) say of the labels LABEL folded into it and of
    its chunks' statuses: how many labels were accepted, when the last was, and how many times a
    chunk's status changed.  Unchanged, no chunk of the state took a label or changed its status."""
    return counters.get("labels_accepted"), counters.get("last_label_ms"), counters.get("status_changes")


class ClosedChunks:
    """Closed chunks' states, read whole once and then only while their label counts or status change."""

    def __init__(self, size: int = CACHED_CHUNKS) -> None:
        self.size = size
        self._states: OrderedDict[tuple[str, str, int], ChunkState] = OrderedDict()
        #: per state: the `label_mark` its chunks below were last found current at
        self._marks: OrderedDict[tuple[str, str], tuple[tuple, set[int]]] = OrderedDict()

    async def states(self, store: ChunkStore, sid: str, ids: list[int], mark: tuple | None = None
                     ) -> list[ChunkState]:
        """The states of the closed chunks `ids` of state `sid` (as `ChunkStore.chunk_states`);
        `mark`: the state's `label_mark`, read before (None: the label counts of every chunk known
        are read)."""
        at, seen = self._marks.get((store.keys.prefix, sid), (None, set()))
        if mark is not None and mark == at and seen.issuperset(ids):
            held = self._held(store.keys.prefix, sid, ids)
            if held is not None:
                return held
        keys = [(store.keys.prefix, sid, t) for t in ids]
        sure = {k for k in keys if k in self._states and k[2] in seen} if mark is not None and mark == at else set()
        known = [k for k in keys if k in self._states and k not in sure]
        counts = await store.label_counts(sid, [t for _, _, t in known]) if known else []
        current = sure | {k for k, (raw, status) in zip(known, counts)
                          if np.array_equal(stratum_vector(raw, self._states[k].strata), self._states[k].n)
                          and status == self._states[k].status}
        fresh = await store.chunk_states(sid, [k[2] for k in keys if k not in current])
        for cs in fresh:
            self._remember((store.keys.prefix, sid, cs.chunk), cs)
        for k in current:
            self._states.move_to_end(k)
        if mark is not None and keys:
            self._note(keys[0][:2], mark, {k[2] for k in current} | {cs.chunk for cs in fresh}
                       | (seen if mark == at else set()))
        by_chunk = {cs.chunk: cs for cs in fresh} | {k[2]: self._states[k] for k in current}
        return [by_chunk[t] for t in ids if t in by_chunk]

    def _held(self, prefix: str, sid: str, ids: list[int]) -> list[ChunkState] | None:
        """The remembered states of `ids`, all current (the state's mark has not moved since each was
        found current), in order; None if one has been let go (`size`)."""
        held = []
        for t in ids:
            cs = self._states.get((prefix, sid, t))
            if cs is None:
                return None
            self._states.move_to_end((prefix, sid, t))
            held.append(cs)
        return held

    def _note(self, state: tuple[str, str], mark: tuple, chunks: set[int]) -> None:
        self._marks[state] = (mark, chunks)
        self._marks.move_to_end(state)
        while len(self._marks) > self.size:
            self._marks.popitem(last=False)

    def _remember(self, key: tuple[str, str, int], cs: ChunkState) -> None:
        self._states[key] = cs
        self._states.move_to_end(key)
        while len(self._states) > self.size:
            self._states.popitem(last=False)


#: the process's memory of closed chunks (`classifier_view` without history reads through it)
CLOSED = ClosedChunks()
