"""How an INGEST call writes a batch into a chunk's score histogram (the ``bins`` string of
big-endian 32-bit counters, `state.keys`): as the counters' new values, or as increments.

A batch of a few hundred records touches a few hundred counters, most of them next to each
other.  Sent as BITFIELD increments, each counter costs the script four arguments to unpack
and a sub-command to parse; that was a third of Redis's work per record on the bench.  So
the ingestor keeps its own copy of each open chunk's counters (`ChunkBins`, read from Redis
once) and sends each run of touched counters as two byte strings, the run as it read it and
as it becomes: INGEST compares the first with what it holds (GETRANGE) and writes the second
(SETRANGE), a copy of bytes either way.  The comparison is the guard: another instance, a
replayed or refused call of this one, or an older version writing increments changes the
counters under the copy, the script refuses (`state.calls.IngestRefusal.BINS_CHANGED`), and the
ingestor reads the counters again and redoes the batch.  Only the counters written are compared, and only
they are written, so what anyone else changed elsewhere in the string stays.  A batch
whose touched counters are scattered (a few records over a wide range of scores) is sent
as increments, which need no copy; the copy is updated the same way.
"""

from __future__ import annotations

import numpy as np

from ..state.records import BINS_ROTATION
from ..stats.sketch import BINS

#: A run of touched counters ends where the next touched one is more than this many counters on.
RUN_GAP = 16
#: Runs are sent when they hold this many touched counters each on average; scattered
#: counters go as increments (a run costs the script a GETRANGE and a SETRANGE, an increment
#: a BITFIELD sub-command).
MIN_TOUCHED_PER_RUN = 4
#: BITFIELD's OVERFLOW SAT: a counter stops at the largest unsigned 32-bit value.
COUNTER_MAX = 2**32 - 1

#: BITFIELD's offset of each bucket's counter (``#p``: the p-th u32), made once: the grid rotated
#: by half (`state.records.BINS_ROTATION`), so that the string of probabilities (buckets from
#: 2048 up) starts at its first byte (an object array: indexing it with the buckets takes a third
#: of the time of a list comprehension).
_COUNTER_OFFSET = np.array([f"#{(b + BINS_ROTATION) % BINS}" for b in range(BINS)], dtype=object)


def histogram_increments(buckets: np.ndarray, counts: np.ndarray) -> list:
    """Flat ``["INCRBY", "u32", "#bucket", count, ...]``: INGEST's BITFIELD arguments for the
    ``bins`` counters (`state.keys`), ready to pass on (the script builds no table per bucket)."""
    out: list = [None] * (4 * buckets.size)
    out[0::4] = ["INCRBY"] * buckets.size
    out[1::4] = ["u32"] * buckets.size
    out[2::4] = _COUNTER_OFFSET[buckets].tolist()
    out[3::4] = counts.tolist()
    return out


def run_breaks(positions: np.ndarray) -> np.ndarray:
    """Where a run of the increasing counter `positions` ends: the indices after which the next
    position is more than `RUN_GAP` on."""
    return np.flatnonzero(positions[1:] - positions[:-1] > RUN_GAP)


def counter_runs(positions: np.ndarray, breaks: np.ndarray | None = None) -> list[tuple[int, int]]:
    """(first, last) of each run of the increasing counter `positions` (`run_breaks`)."""
    ends = (run_breaks(positions) if breaks is None else breaks).tolist()
    # a few runs of many positions: index the runs' ends, not every position
    return [(int(positions[a]), int(positions[b])) for a, b in zip([0] + [e + 1 for e in ends],
                                                                     ends + [positions.size - 1])]


class ChunkBins:
    """This instance's copy of one chunk's ``bins`` counters, in the string's order (bucket b at
    (b + BINS_ROTATION) mod BINS) and byte order (big-endian, so a run's bytes are a slice of
    the copy's), as long as the highest counter it has seen."""

    __slots__ = ("counts",)

    def __init__(self, packed: bytes | None = None) -> None:
        self.counts = np.frombuffer(packed or b"", dtype=">u4")[:BINS].copy()

    def add(self, buckets: np.ndarray, counts: np.ndarray) -> dict:
        """Add `counts` to the counters of `buckets` (distinct, increasing) and return INGEST's
        payload field that does the same in Redis: ``{"runs": [[byte offset, old, new], ...]}``
        (the runs' bytes before and after) or, for few or scattered counters, ``{"hist":
        histogram_increments(...)}``.  (Short of numpy calls: a batch of a few records is the
        common call when many classifiers share a partition.)"""
        if buckets.size < 2 * MIN_TOUCHED_PER_RUN:  # too few for a run: one at a time is quicker
            self._add_each(buckets.tolist(), counts.tolist())
            return {"hist": histogram_increments(buckets, counts)}
        positions = (buckets + BINS_ROTATION) & (BINS - 1)
        wraps = buckets[0] < BINS - BINS_ROTATION <= buckets[-1]
        at = np.sort(positions) if wraps else positions
        self._reach(int(at[-1]))
        breaks = run_breaks(at)
        scattered = (breaks.size + 1) * MIN_TOUCHED_PER_RUN > at.size
        before = b"" if scattered else self.counts.tobytes()
        added = self.counts[positions] + counts.astype(np.uint64)
        self.counts[positions] = np.minimum(added, COUNTER_MAX) if added.max() > COUNTER_MAX else added
        if scattered:
            return {"hist": histogram_increments(buckets, counts)}
        after = self.counts.tobytes()
        return {"runs": [[4 * a, before[4 * a:4 * b + 4], after[4 * a:4 * b + 4]]
                         for a, b in counter_runs(at, breaks)]}

    def _add_each(self, buckets: list[int], counts: list[int]) -> None:
        positions = [(b + BINS_ROTATION) & (BINS - 1) for b in buckets]
        if positions:
            self._reach(max(positions))
        mine = self.counts
        for p, c in zip(positions, counts):
            mine[p] = min(int(mine[p]) + c, COUNTER_MAX)

    def _reach(self, position: int) -> None:
        """Grow the copy with zero counters to hold `position` (as Redis reads past a string's end)."""
        if position >= self.counts.size:
            grown = np.zeros(position + 1, ">u4")  # (concatenate would give the machine's byte order)
            grown[:self.counts.size] = self.counts
            self.counts = grown
