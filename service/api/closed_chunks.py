"""What a scrape remembers of closed chunks: a window pools the reported chunk and up to
``HISTORY_CHUNKS`` chunks before it (`chunks.window`), and reading every one of them whole at every
scrape made a scrape several times dearer.  A closed chunk's items no longer change (no score
reaches it) and its labels only grow (an answer folded by LABEL adds to ``n``, and to ``h`` only
with it), so a closed chunk read before is still current while its label counts and its status are
(the request loop may yet find it converged, which a window reads, `chunks.window`): one small read
a chunk (`ChunkStore.label_counts`) instead of five, and the whole chunk again only once a label
came or the status changed.  Process-local and bounded (`CACHED_CHUNKS`, least recently used out first)."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from ..state.chunk_store import ChunkStore
from ..state.records import ChunkState, stratum_vector

#: closed chunks remembered (one entry a state and chunk: its counts per stratum)
CACHED_CHUNKS = 100_000


class ClosedChunks:
    """Closed chunks' states, read whole once and then only while their label counts change."""

    def __init__(self, size: int = CACHED_CHUNKS) -> None:
        self.size = size
        self._states: OrderedDict[tuple[str, str, int], ChunkState] = OrderedDict()

    async def states(self, store: ChunkStore, sid: str, ids: list[int]) -> list[ChunkState]:
        """The states of the closed chunks `ids` of state `sid` (as `ChunkStore.chunk_states`)."""
        keys = [(store.keys.prefix, sid, t) for t in ids]
        known = [k for k in keys if k in self._states]
        counts = await store.label_counts(sid, [t for _, _, t in known]) if known else []
        current = {k for k, (raw, status) in zip(known, counts)
                   if np.array_equal(stratum_vector(raw, self._states[k].strata), self._states[k].n)
                   and status == self._states[k].status}
        fresh = await store.chunk_states(sid, [k[2] for k in keys if k not in current])
        for cs in fresh:
            self._remember((store.keys.prefix, sid, cs.chunk), cs)
        for k in current:
            self._states.move_to_end(k)
        by_chunk = {cs.chunk: cs for cs in fresh} | {k[2]: self._states[k] for k in current}
        return [by_chunk[t] for t in ids if t in by_chunk]

    def _remember(self, key: tuple[str, str, int], cs: ChunkState) -> None:
        self._states[key] = cs
        self._states.move_to_end(key)
        while len(self._states) > self.size:
            self._states.popitem(last=False)


#: the process's memory of closed chunks (`classifier_view` without history reads through it)
CLOSED = ClosedChunks()
