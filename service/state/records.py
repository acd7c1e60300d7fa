"""What the store reads, as Python values: a chunk's state, its strata boundaries, a
window of a stratum's reservoir."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..stats.sketch import BINS


@dataclass
class ChunkState:
    """One chunk of one classifier as stored."""

    chunk: int
    cuts: np.ndarray
    N: np.ndarray
    n: np.ndarray
    h: np.ndarray
    round: int = 0
    evaluated_round: int = 0
    streak: int = 0
    status: str = "open"
    replace: dict[int, int] = field(default_factory=dict)
    min: float = float("nan")
    max: float = float("nan")
    tau: np.ndarray | None = None  # per stratum the inclusion threshold (stats.streams), None before any request
    first_ms: int = -1  # wall-clock time of the chunk's first and last arrival
    last_ms: int = -1
    provisional: bool = False  # one stratum until RESTRATIFY sets its K strata (or FREEZE keeps it): not sampled
    status_closed: bool = False  # `status` was judged after the chunk closed (its final verdict)
    reservoir_size: int | None = None  # RESERVOIR_SIZE when it opened (OPEN_CHUNK); None: opened before the field

    @property
    def strata(self) -> int:
        return self.cuts.size + 1

    @property
    def thresholds(self) -> np.ndarray:
        tau = np.zeros(self.strata) if self.tau is None else np.asarray(self.tau, dtype=float)
        return tau if tau.size == self.strata else np.zeros(self.strata)

    def effective_reservoir_size(self, configured: int) -> int:
        """The bottom-k size of this chunk's reservoirs under RESERVOIR_SIZE `configured`: the
        size it opened with, or a smaller one set since (as INGEST keeps them).  A size raised
        mid-chunk waits for the next chunk: the early items it would keep are gone already."""
        return configured if self.reservoir_size is None else min(self.reservoir_size, configured)


@dataclass
class ReservoirWindow:
    """The part of one stratum's reservoir the request loop needs (see `chunk_store.ChunkStore.reservoir_windows`)."""

    below: list[tuple[str, float]]  # (member, priority) at or below the threshold
    above: list[tuple[str, float]]  # the lowest few above it
    above_count: int
    size: int
    largest: float  # the largest priority kept


def stratum_vector(raw: dict, k: int) -> np.ndarray:
    """A ``{stratum: count}`` hash as stored, as counts per stratum for `k` strata (absent: 0)."""
    out = np.zeros(k, dtype=np.int64)
    for key, val in raw.items():
        i = int(key)
        if 0 <= i < k:
            out[i] = int(val)
    return out


@dataclass(frozen=True)
class ChunkCuts:
    """A chunk's strata boundaries as stored, with their version (see lua/restratify.lua).

    `provisional`: opened with one stratum (no earlier histogram, opening batch too small);
    its cuts change once, when it is re-stratified, and `version` then increments."""

    cuts: np.ndarray
    version: int = 0
    provisional: bool = False


#: Bucket b's counter in the ``bins`` string is the ((b + BINS_ROTATION) mod BINS)-th: score 0
#: (bucket 2048) comes first.  A string is as long as its highest counter written, so a
#: classifier of probabilities keeps at most 4 KB (scores up to 1 end at bucket 3072), not 16 KB.
BINS_ROTATION = BINS // 2


def histogram_counts(packed: bytes | None, legacy: dict) -> np.ndarray:
    """A chunk's score histogram as `BINS` counts: the ``bins`` string (big-endian unsigned 32-bit
    counters, bucket b at position (b + `BINS_ROTATION`) mod BINS, as long as its highest counter
    written) plus the ``hist`` hash versions before it wrote (bucket -> count); zeros while it has
    neither (`keys`)."""
    counts = np.zeros(BINS, dtype=np.int64)
    if packed:
        dense = np.frombuffer(packed[: 4 * BINS], dtype=">u4")
        counts[: dense.size] = dense
        counts = np.roll(counts, -BINS_ROTATION)
    for b, c in legacy.items():
        if 0 <= int(b) < BINS:
            counts[int(b)] += int(c)
    return counts


@dataclass(frozen=True)
class LabelledRecords:
    """A chunk's labelled items as LABEL keeps them (``c:<t>:labelled``), one entry per label,
    in request-id order; `unreadable` counts entries that did not parse."""

    request_ids: list[str]
    stratum: np.ndarray
    label: np.ndarray
    score: np.ndarray
    unreadable: int = 0


def labelled_records(raw: dict) -> LabelledRecords:
    """Parse ``request id -> "<stratum> <label> <score>"`` (bytes from HGETALL)."""
    rids, rows, bad = [], [], 0
    for rid, value in sorted(raw.items()):
        try:
            k, y, s = value.split()
            row = (int(k), int(y), float(s))
        except ValueError:
            bad += 1
            continue
        if row[1] not in (0, 1) or not np.isfinite(row[2]):
            bad += 1
            continue
        rids.append(rid.decode() if isinstance(rid, bytes) else rid)
        rows.append(row)
    table = np.array(rows, dtype=float).reshape(-1, 3)
    return LabelledRecords(rids, table[:, 0].astype(np.int64), table[:, 1].astype(np.int64), table[:, 2], bad)
