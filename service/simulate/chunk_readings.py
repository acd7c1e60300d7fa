"""What the service shows of a stream of consecutive chunks at every reading (`simulate --stream
--chunks`): the window, the last closed chunk and the reported chunk, from the chunks' states
(`chunk_states.ChunkStates`), as `api.views.classifier_view` computes them at a scrape.

At a reading at ``t`` (every `SCRAPE_SECONDS` from the stream's start, chunk ``i`` covering
``[i T, (i + 1) T)``):

* the reported chunk (`api.views.reported_chunk`): the newest started chunk once its interval exists,
  else the one before it if that has one;
* the window of ``k`` chunks: the reported chunk and the ``k - 1`` before it
  (`chunks.window.window_chunks`), pooled by `chunks.window.window_report` over their (chunk,
  stratum) cells as they stand at ``t`` (a closed chunk's with the finite population correction, a
  chunk that has stopped ``converged`` read at the stop), the estimate clipped into its interval
  (`api.views._interval_doc`); its truth is the precision of the items of its chunks arrived by ``t``;
* the last closed chunk (`api.views._last_closed`): the newest chunk closed at ``t``, its interval
  as its state at ``t`` gives it, its estimate the reading at the stopping rule's stop once it has
  stopped ``converged``; its truth the precision of its items.

Many windows are pooled in one `window_report` call (its columns with a leading axis of readings):
the chunks before the reported one are read off their states, not recomputed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..chunks.report import StrataColumns
from ..chunks.window import WindowPart, window_report
from .chunk_states import ChunkStates


@dataclass
class Series:
    """One series' readings, (runs, readings) float32; NaN where it shows nothing."""

    estimate: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    truth: np.ndarray

    @classmethod
    def empty(cls, runs: int, readings: int) -> "Series":
        return cls(*(np.full((runs, readings), np.nan, dtype=np.float32) for _ in range(4)))

    @property
    def shown(self) -> np.ndarray:
        return np.isfinite(self.lower) & np.isfinite(self.upper)

    @property
    def covered(self) -> np.ndarray:
        return self.shown & (self.lower <= self.truth) & (self.truth <= self.upper)

    @property
    def halfwidth(self) -> np.ndarray:
        return (self.upper - self.lower) / 2.0

    @classmethod
    def concat(cls, parts: list["Series"]) -> "Series":
        return cls(*(np.concatenate([getattr(p, f) for p in parts]) for f in ("estimate", "lower", "upper", "truth")))


@dataclass
class Readings:
    """A block of runs read every `every` seconds (reading ``g`` at ``g * every``, g = 1, 2, ...)."""

    every: float
    window: Series
    last_closed: Series
    reported_upper: np.ndarray  # (runs, readings) the reported chunk's upper bound (the chunk-level alert)
    window_chunks: np.ndarray  # (runs, readings) int8: chunks the window pools

    @property
    def seconds(self) -> np.ndarray:
        return (np.arange(self.window.lower.shape[1]) + 1) * self.every

    @classmethod
    def concat(cls, parts: list["Readings"]) -> "Readings":
        return cls(parts[0].every, Series.concat([p.window for p in parts]),
                   Series.concat([p.last_closed for p in parts]),
                   np.concatenate([p.reported_upper for p in parts]), np.concatenate([p.window_chunks for p in parts]))


@dataclass(frozen=True)
class Stream:
    """The layout of a block: `runs` runs of `chunks` chunks of `chunk_readings` readings each,
    chunk ``i`` of run ``b`` at ``i * runs + b`` of the states; windows of `length` chunks."""

    states: ChunkStates
    runs: int
    chunks: int
    chunk_readings: int
    length: int
    lateness_readings: float

    def at(self, chunk: np.ndarray, g: np.ndarray, field: str) -> np.ndarray:
        """`field` of `chunk` (per row, of the block's run in that row) at reading `g` (a started chunk)."""
        slot = self.states.slot(g - chunk * self.chunk_readings)
        return getattr(self.states, field)[slot, chunk * self.runs + self.run_of(g)]

    def closed(self, chunk: np.ndarray, g: np.ndarray) -> np.ndarray:
        """Whether `chunk` (per row) has closed at reading `g` (a started chunk)."""
        return self.states.closed[self.states.slot(g - chunk * self.chunk_readings)]

    def stopped(self, chunk: np.ndarray, g: np.ndarray) -> np.ndarray:
        """Whether `chunk` (per row) has stopped ``converged`` by reading `g`: it is read at the stop."""
        index = chunk * self.runs + self.run_of(g)
        since = (g - chunk * self.chunk_readings) * self.states.every
        return (since >= self.states.stop[index]) & self.states.converged[index]

    def run_of(self, g: np.ndarray) -> np.ndarray:
        return np.broadcast_to(np.arange(self.runs).reshape((-1,) + (1,) * (g.ndim - 1)), g.shape)

    def has_interval(self, chunk: np.ndarray, g: np.ndarray) -> np.ndarray:
        return (chunk >= 0) & np.isfinite(self.at(np.maximum(chunk, 0), g, "upper"))

    def reported(self, g: np.ndarray) -> np.ndarray:
        """Per row, the reported chunk at reading `g` (`api.views.reported_chunk`)."""
        newest = np.minimum(g // self.chunk_readings, self.chunks - 1)
        back = ~self.has_interval(newest, g) & self.has_interval(newest - 1, g)
        return newest - back


def read_block(stream: Stream, confidence: float) -> Readings:
    """Every reading of the block's runs, an hour of readings (a chunk's) at a time."""
    R, P = stream.runs, stream.chunk_readings
    total = stream.chunks * P
    window, last = Series.empty(R, total), Series.empty(R, total)
    reported_upper = np.full((R, total), np.nan, dtype=np.float32)
    pooled = np.zeros((R, total), dtype=np.int8)
    for lo in range(0, total, P):
        cols = slice(lo, min(total, lo + P))
        g = np.broadcast_to(np.arange(cols.start, cols.stop) + 1, (R, cols.stop - cols.start))
        rep = stream.reported(g)
        reported_upper[:, cols] = stream.at(rep, g, "upper")
        pooled[:, cols] = np.minimum(rep + 1, stream.length)
        _read_windows(stream, g, rep, window, cols, confidence)
        _read_last_closed(stream, g, last, cols)
    return Readings(stream.states.every, window, last, reported_upper, pooled)


def _read_windows(stream: Stream, g: np.ndarray, rep: np.ndarray, out: Series, cols: slice, confidence: float) -> None:
    """The window of each row (`window_report` over the rows at once, each chunk's closed and
    stopped per row), into `out` at `cols`."""
    K = stream.states.N.shape[2]
    member = rep[..., None] - stream.length + 1 + np.arange(stream.length)  # (runs, readings, length)
    valid = member >= 0
    gg = np.broadcast_to(g[..., None], member.shape)
    take = lambda f: np.where(valid[..., None] if f != "G" else valid, stream.at(  # noqa: E731
        np.maximum(member, 0), gg, f), 0.0)
    N, n, h, G = (take(f) for f in ("N", "n", "h", "G"))
    at = np.maximum(member, 0)
    closed, stopped = stream.closed(at, gg), stream.stopped(at, gg)
    parts = [WindowPart(q, StrataColumns(N[..., q, :].reshape(-1, K), n[..., q, :].reshape(-1, K),
                                         h[..., q, :].reshape(-1, K), np.ones(K, bool)),
                        closed[..., q].ravel(), stopped=stopped[..., q].ravel()) for q in range(stream.length)]
    iv = window_report(parts, ["precision"], confidence).intervals["precision"]
    est, lower, upper = (np.reshape(x, rep.shape) for x in (iv.estimate, iv.lower, iv.upper))
    with np.errstate(invalid="ignore", divide="ignore"):
        truth = G.sum(axis=-1) / N.sum(axis=(-1, -2))
    _store(out, cols, est, lower, upper, truth)


def _read_last_closed(stream: Stream, g: np.ndarray, out: Series, cols: slice) -> None:
    """The newest chunk closed at each reading, into `out` at `cols` (none before the first closes)."""
    P = stream.chunk_readings
    newest = np.floor((g - stream.lateness_readings) / P).astype(np.int64) - 1
    chunk = np.minimum(newest, stream.chunks - 1)
    ok = chunk >= 0
    c = np.maximum(chunk, 0)
    index = c * stream.runs + stream.run_of(g)
    stopped = stream.stopped(c, g)
    est = np.where(stopped, stream.at(c, g, "at_stop"), stream.at(c, g, "estimate"))
    lower, upper = stream.at(c, g, "lower"), stream.at(c, g, "upper")
    nothing = np.where(ok, 1.0, np.nan)
    _store(out, cols, est * nothing, lower * nothing, upper * nothing, stream.states.truth[index] * nothing)


def _store(out: Series, cols: slice, est, lower, upper, truth) -> None:
    """A series' readings at `cols`: the estimate clipped into its interval (`api.views._interval_doc`),
    nothing where the interval is not finite."""
    ok = np.isfinite(lower) & np.isfinite(upper)
    out.estimate[:, cols] = np.where(ok, np.clip(est, lower, upper), np.nan)
    out.lower[:, cols] = np.where(ok, lower, np.nan)
    out.upper[:, cols] = np.where(ok, upper, np.nan)
    out.truth[:, cols] = truth
