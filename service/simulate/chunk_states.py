"""The chunks `stratameter simulate --stream --chunks` strings together, each read as the service
reads it every `trace.SCRAPE_SECONDS`.

Without an hourly budget nothing couples two chunks of a stream: each is sampled by the request
loop on its own items, strata and thresholds (`requests.loop` steps every chunk it samples alone),
and a Poisson stream's items in two disjoint hours are independent.  So a run of C consecutive
chunks is C chunks drawn and run by `stream.run_chunks` side by side, chunk ``i`` shifted by
``i`` chunk lengths.  `CountRecorder` keeps each chunk's counts per stratum at every reading of
its own clock until it stops; a stopped chunk's counts stay as they were (nothing is pending), so
`ChunkStates` holds per chunk its counts at its start (nothing), at each reading, and at the end,
with each of those states' interval as the service computes it (`chunks.report.chunk_report`, the
finite population correction once the chunk has closed): the closed chunks of a window are not
recomputed at every reading (`chunk_readings`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..chunks import lifecycle
from ..chunks.report import StrataColumns, chunk_report
from .arrivals import Chunks, Scenario, StreamSettings, draw
from .stream import run_chunks
from .trace import GaugeRecorder


class CountRecorder(GaugeRecorder):
    """A `trace.GaugeRecorder` that keeps what a reading is computed from instead of its interval:
    per reading, every run's items, labels and labelled positives per stratum and its arrived true
    positives (a stopped run's stay as at its stop)."""

    def _reading(self, t, closed, active, N, n, h, calibrate) -> tuple[np.ndarray, ...]:
        return N.copy(), n.copy(), h.copy(), self.G.sum(axis=1)

    def result(self) -> list[tuple[np.ndarray, ...]]:
        return self.columns


@dataclass
class ChunkStates:
    """Per chunk of the runs (axis ``c``), its counts at slot 0 (its start: nothing), at slots 1..L
    (the readings every `every` seconds of its own clock) and at slot L + 1 (its end: as at its
    last reading); arrays (slots, chunks[, strata]).  ``closed`` per slot (the end slot: True)."""

    every: float
    N: np.ndarray
    n: np.ndarray
    h: np.ndarray
    G: np.ndarray  # arrived true positives
    closed: np.ndarray  # (slots,)
    stop: np.ndarray  # (chunks,) seconds after its start at which its loop stopped
    converged: np.ndarray  # (chunks,) its status at the stop is ``converged``
    truth: np.ndarray  # (chunks,) precision of all its items
    lower: np.ndarray | None = None  # (slots, chunks), `with_intervals`
    upper: np.ndarray | None = None
    estimate: np.ndarray | None = None
    at_stop: np.ndarray | None = None

    @property
    def slots(self) -> int:
        return self.N.shape[0]

    def slot(self, local: np.ndarray) -> np.ndarray:
        """The slot of readings `local` (whole readings since the chunk's start, >= 0)."""
        return np.minimum(local, self.slots - 1)

    def padded(self, slots: int) -> "ChunkStates":
        """The same states over `slots` slots, the end state repeated at the readings added."""
        extra = slots - self.slots
        if extra <= 0:
            return self
        grow = lambda x: np.concatenate([x, np.repeat(x[-1:], extra, axis=0)])  # noqa: E731
        return replace(self, N=grow(self.N), n=grow(self.n), h=grow(self.h), G=grow(self.G),
                       closed=np.concatenate([self.closed, np.ones(extra, bool)]))

    @classmethod
    def concat(cls, parts: list["ChunkStates"]) -> "ChunkStates":
        """The chunks of several parts side by side (padded to the most slots)."""
        slots = max(p.slots for p in parts)
        parts = [p.padded(slots) for p in parts]
        joined = {f: np.concatenate([getattr(p, f) for p in parts], axis=1 if f in ("N", "n", "h", "G") else 0)
                  for f in ("N", "n", "h", "G", "stop", "converged", "truth")}
        return cls(parts[0].every, closed=parts[0].closed, **joined)

    def with_intervals(self, confidence: float) -> "ChunkStates":
        """Every state's precision interval (`chunk_report`, with the correction once closed)."""
        S, C, K = self.N.shape
        out = {f: np.full((S, C), np.nan) for f in ("lower", "upper", "estimate", "at_stop")}
        for closed in (False, True):
            at = np.flatnonzero(self.closed == closed)
            if not at.size:
                continue
            cols = StrataColumns(*(x[at].reshape(-1, K) for x in (self.N, self.n, self.h)), np.ones(K, bool))
            iv = chunk_report(cols, ["precision"], confidence, closed).intervals["precision"]
            for f, v in (("lower", iv.lower), ("upper", iv.upper), ("estimate", iv.estimate),
                         ("at_stop", iv.estimate_at_stop)):
                out[f][at] = np.asarray(v, float).reshape(at.size, C)
        return replace(self, **out)


def run_states(c: Chunks, s: StreamSettings, every: float) -> ChunkStates:
    """`stream.run_chunks` on the drawn chunks `c`, read every `every` seconds (`CountRecorder`)."""
    rec = CountRecorder(c.runs, c.K, every, s.chunk_seconds, s.lateness, s.confidence)
    out = run_chunks(c, s, recorder=rec)
    N, n, h, G = (np.stack(x) for x in zip(*rec.result()))
    zero = lambda x: np.zeros_like(x[:1])  # noqa: E731
    N, n, h, G = (np.concatenate([zero(x), x, x[-1:]]) for x in (N, n, h, G))
    times = np.arange(N.shape[0]) * every
    closed = np.asarray(lifecycle.is_closed(times, s.chunk_seconds, s.lateness))
    closed[-1] = True
    return ChunkStates(every, N, n, h, G.astype(float), closed, np.asarray(out.stop_seconds, float),
                       np.asarray(out.status == "converged"), np.asarray(c.truth, float))


def drop_scenario(scenario: Scenario, drop_by: float) -> Scenario:
    """`scenario` with its chunks' precision lower by `drop_by` over the whole chunk (positives
    relabelled negative at random, as the ``drift`` scenario's second half)."""
    return replace(scenario, name=f"{scenario.name}-drop", drift=drop_by, drift_after=0.0)


def draw_states(pop, scenario: Scenario, s: StreamSettings, runs: int, chunks: int, drop_at: int | None,
                drop_by: float, every: float, rng: np.random.Generator) -> ChunkStates:
    """`runs` runs of `chunks` consecutive chunks (chunk ``i`` of run ``b`` at ``i * runs + b``), those
    from chunk `drop_at` on with their precision lower by `drop_by` (`drop_scenario`), read every
    `every` seconds, with their intervals."""
    first = chunks if drop_at is None else min(drop_at, chunks)
    parts = [(scenario, first), (drop_scenario(scenario, drop_by), chunks - first)]
    states = [run_states(draw(pop, sc, s, runs * k, rng), s, every) for sc, k in parts if k > 0]
    return ChunkStates.concat(states).with_intervals(s.confidence)
