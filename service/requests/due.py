"""The items a chunk's requests go to (the request loop's `_carry_out`): every unrequested reservoir
item at or below its stratum's inclusion threshold (the threshold sample, `stats.streams`), after a
round has raised the thresholds of the strata it wants more labels from."""

from __future__ import annotations

import numpy as np
import orjson

from ..chunks.plan import Side
from ..state.chunk_store import ChunkStore
from ..state.request_store import RequestStore
from ..stats import streams


async def due_by_side(chunks: ChunkStore, requests: RequestStore, sides: list[Side], tau: np.ndarray,
                      want: np.ndarray) -> tuple[list, list, int]:
    """`_due` for each side's slice of the chunk's strata: the due items of both sides, the most
    urgent first, each side's thresholds (None for a side with no items or held), the items left."""
    due, taus, left, at = [], [], 0, 0
    for sd in sides:
        k = sd.strata
        if sd.cs is not None and not sd.held:
            d, tau_side, left_side = await _due(chunks, requests, sd, tau[at:at + k], want[at:at + k])
            due += d
            left += left_side
            taus.append(tau_side)
        else:
            taus.append(None)
        at += k
    due.sort(key=lambda d: d[0])
    return due, taus, left


async def _due(chunks: ChunkStore, requests: RequestStore, sd: Side, tau: np.ndarray, want: np.ndarray
               ) -> tuple[list[tuple[float, str, int, str]], np.ndarray, int]:
    """Unrequested reservoir items at or below each stratum's threshold, after
    raising the thresholds of the strata a round wants `want` more labels from.

    Returns the due items as (urgency, state id, stratum, member), the most urgent first
    (lowest priority relative to its threshold), the thresholds, and the
    number of items left above them.  Items above a threshold were never
    requested (requests only ever go to items at or below it).  A full
    reservoir keeps nothing above its largest priority, so no threshold
    rises past it (the design's cap on labels per stratum and chunk)."""
    cid, cs, cfg = sd.state_id, sd.cs, sd.cfg
    tau = np.array(tau, dtype=float)
    windows = await chunks.reservoir_windows(cid, cs.chunk, tau, want)
    below = [(k, raw, p) for k, w in enumerate(windows) for raw, p in w.below]
    taken = await requests.sampled(cid, cs.chunk, [orjson.loads(raw)["i"] for _, raw, _ in below])
    due = [(p / max(tau[k], 1e-300), k, raw) for (k, raw, p), t in zip(below, taken) if not t]
    left = 0
    for k, w in enumerate(windows):
        raised = streams.threshold_after(tau[k], [p for _, p in w.above], int(want[k]))
        if w.size >= cs.effective_reservoir_size(cfg.reservoir_size):
            raised = min(raised, w.largest)
        tau[k] = max(cs.thresholds[k], raised)
        due += [(p / max(tau[k], 1e-300), k, raw) for raw, p in w.above if p <= tau[k]]
        left += w.above_count - sum(1 for _, p in w.above if p <= tau[k])
    due.sort()
    return [(u, cid, k, raw) for u, k, raw in due], tau, left
