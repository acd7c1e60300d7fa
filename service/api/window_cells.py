"""What a scrape remembers of a window's closed chunks: each metric's sums over their cells
(`chunks.window.WindowCells`, `stats.pooled.CellSums`), so that a scrape adds the open chunks' to
them instead of computing them again.  A closed chunk's cells change only with its labels and its
status (its items are final), and the memory holds them only while every closed chunk of the window
is what it was: the same chunks, each with the same counts per stratum (`api.closed_chunks` hands
back the very state it read before while its labels and status have not changed; a chunk read whole
again is compared by its counts), status and flags.  The figures are those of the window's chunks
pooled at once (`chunks.window.pooled_report`).  Process-local and bounded (`CACHED_WINDOWS`
windows, least recently used out first)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import numpy as np

from ..chunks.window import WindowCells, WindowPart, window_cells
from ..state.records import ChunkState

#: windows remembered (one entry a state prefix, classifier, window length and metrics)
CACHED_WINDOWS = 20_000

#: one closed chunk as its cells depend on it: (chunk, its predicted positives' state, its negatives'
#: state or None, whether it was counted whole, whether its negatives were)
ChunkInputs = tuple[int, ChunkState | None, ChunkState | None, bool, bool | None]


class ClosedCells:
    """The sums of windows' closed chunks, computed once while those chunks do not change."""

    def __init__(self, size: int = CACHED_WINDOWS) -> None:
        self.size = size
        self._cells: OrderedDict[tuple, tuple[tuple[ChunkInputs, ...], WindowCells]] = OrderedDict()

    def cells(self, key: tuple, inputs: tuple[ChunkInputs, ...], parts: Callable[[], list[WindowPart]],
              metrics: tuple[str, ...]) -> WindowCells:
        """`window_cells(parts(), metrics)` of the closed chunks `inputs` describes, remembered under
        `key` (with the metrics) and computed again only once `inputs` differ."""
        key = (*key, metrics)
        held = self._cells.get(key)
        if held is not None and _same_inputs(held[0], inputs):
            self._cells.move_to_end(key)
            return held[1]
        cells = window_cells(parts(), metrics)
        self._cells[key] = (inputs, cells)
        self._cells.move_to_end(key)
        while len(self._cells) > self.size:
            self._cells.popitem(last=False)
        return cells


def _same_inputs(a: tuple[ChunkInputs, ...], b: tuple[ChunkInputs, ...]) -> bool:
    # the states `api.closed_chunks` hands back again are the very objects: compared by identity first
    return len(a) == len(b) and all(x[0] == y[0] and x[3:] == y[3:] and (x[1] is y[1] or _same_state(x[1], y[1]))
                                    and (x[2] is y[2] or _same_state(x[2], y[2])) for x, y in zip(a, b))


def _same_state(a: ChunkState | None, b: ChunkState | None) -> bool:
    """Whether a chunk's cells read the same from `a` as from `b`: its counts per stratum and status."""
    if a is b:
        return True
    if a is None or b is None:
        return False
    return (a.status == b.status and a.strata == b.strata
            and all(np.array_equal(getattr(a, f), getattr(b, f)) for f in ("N", "n", "h")))


#: the process's memory of windows' closed chunks (`api.views`)
CELLS = ClosedCells()
