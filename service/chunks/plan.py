"""The plan of one step of the request loop for one chunk: pure, so that what the loop decides can
be read (and tested) apart from how it reads and writes Redis (`requests.loop`).

A step looks at the chunk's sides (`Side`: its predicted positives, and its predicted negatives
when the classifier's metrics need them) as a `ChunkSnapshot`; if anything the design looks at has
changed since the last step, the loop reads the chunk's report (`report.chunk_report`) and the
allocation's prior and `plan_chunk` gives the round: whether a completed round is evaluated (the
T-round streak of Bennett & Carvalho 2010, Fig. 1), whether the design has converged, and per
stratum the threshold to pace to (`stats.streams.plan_requests`) and the labels a round wants.
Once the loop has read the reservoir items due under those thresholds, `ChunkPlan.status` gives
the chunk's status (`lifecycle.chunk_status`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..state.records import ChunkState
from ..stats import allocation, stopping, streams
from ..stats.target import Target
from .lifecycle import chunk_closed, chunk_status
from .report import ChunkReport, StrataColumns


@dataclass
class Side:
    """One side of a chunk: the state holding the predicted positives (the classifier's) or the
    predicted negatives (`state.keys.negatives_of`), as the loop sees it this step."""

    state_id: str
    cs: ChunkState | None  # None: no item of this side in the chunk yet
    cfg: object  # the side's settings (`Settings.for_classifier(state_id)`)
    first_stratum: int  # the stratum id of its stratum 0 in requests and the API (0, or K for negatives)
    pending: int
    #: False for the negatives of a chunk some of whose records never reached their state
    #: (`lifecycle.counted_whole`): never sampled, and no metric that needs them is estimated
    complete: bool = True

    @property
    def positive(self) -> bool:
        return self.first_stratum == 0

    @property
    def held(self) -> bool:
        """A provisional side stepped beside a final one: counted, never sampled (`sampled_sides`)."""
        return self.cs is not None and self.cs.provisional

    @property
    def strata(self) -> int:
        return self.cs.strata if self.cs is not None else 1

    @property
    def capacity(self) -> np.ndarray:
        """The most labels each stratum can take this chunk: its items, at most the reservoir's
        bottom-k size (``RESERVOIR_SIZE`` as the chunk keeps it), which holds the only items a
        request can go to."""
        if self.cs is None:
            return np.zeros(1)
        return np.minimum(self.cs.N, self.cs.effective_reservoir_size(self.cfg.reservoir_size))

    def column(self, name: str) -> np.ndarray:
        """N, n, h or thresholds of the side's strata (zeros for a side with no items yet)."""
        if self.cs is None:
            return np.zeros(1)
        return self.cs.thresholds if name == "thresholds" else getattr(self.cs, name)


def sampled_sides(sides: list[Side], cfg) -> list[Side]:
    """The sides of a chunk the loop steps now.  A provisional side (one stratum until 25 x K of
    its items have arrived and RESTRATIFY sets its strata) is never sampled but is stepped *held*
    beside a final one: its items count in the design, its stratum has no label, so no interval
    is reported and the chunk cannot converge, while the final side is sampled meanwhile (else a
    rare-positive chunk's negatives paused from its first predicted positive to its 100th, on a
    slow stream all chunk long).  While the negatives' side is provisional, the positives' is
    sampled alone for precision if enabled (today's precision design).  Nothing while no side is
    final.  Negatives that are not `complete` are never sampled: the positives alone, for
    precision if enabled, else nothing."""
    if not all(sd.complete for sd in sides):
        sides = sides[:1] if "precision" in cfg.metrics.split(",") else []
    if not any(sd.held for sd in sides):
        return sides
    if not any(sd.cs is not None and not sd.held for sd in sides):
        return []
    positives = sides[0]
    if not positives.held and "precision" in cfg.metrics.split(","):
        return [positives]
    return sides


@dataclass(frozen=True)
class ChunkSnapshot:
    """What one step of the loop looks at in one chunk: its sides' strata side by side (the
    positives' first), with the arrivals and the requests still out."""

    chunk: int
    sides: tuple[Side, ...]
    N: np.ndarray
    n: np.ndarray
    h: np.ndarray
    thresholds: np.ndarray
    pending: int
    closed: bool
    metrics: tuple[str, ...]  # the classifier's enabled metrics
    flowing: bool  # items still arrive (`streams.arrivals_flowing`) and the chunk is open
    final_size: float  # the chunk's expected final size (`streams.expected_final_size`)

    @property
    def lead(self) -> Side:
        """The side the chunk's streak and status live with: the positives, else the negatives."""
        return next(sd for sd in self.sides if sd.cs is not None)

    @property
    def capacity(self) -> np.ndarray:
        """Per stratum, the most labels it can take (`Side.capacity`)."""
        return np.concatenate([sd.capacity for sd in self.sides])

    @property
    def columns(self) -> StrataColumns:
        positive = np.concatenate([np.full(sd.strata, sd.positive) for sd in self.sides])
        return StrataColumns(self.N, self.n, self.h, positive)

    @property
    def target(self) -> Target | None:
        """What the design aims at: None (the precision design) for a classifier that samples only
        its predicted positives, else its metrics over both sides' strata."""
        if len(self.sides) == 1:
            return None
        return Target(self.metrics, self.columns.positive)

    @property
    def key(self) -> tuple:
        """Everything the design looks at: a step that finds it unchanged plans nothing new."""
        return (float(self.N.sum()), int(self.n.sum()), self.pending, self.flowing, self.closed,
                self.thresholds.tobytes())


def chunk_snapshot(chunk: int, sides: list[Side], cfg, now_ms: int) -> ChunkSnapshot:
    """The snapshot of `chunk`'s `sides` (at least one with items) at `now_ms`."""
    N, n, h, thresholds = (np.concatenate([sd.column(c) for sd in sides]) for c in ("N", "n", "h", "thresholds"))
    live = [sd.cs for sd in sides if sd.cs is not None]
    now_s, end_s = now_ms / 1000, (chunk + 1) * cfg.chunk_seconds
    first_s = min(cs.first_ms for cs in live) / 1000
    last_s = max(cs.last_ms for cs in live) / 1000
    closed = chunk_closed(chunk, cfg, now_s)
    total = float(N.sum())
    flowing = bool(streams.arrivals_flowing(total, first_s, last_s, now_s, end_s, cfg.chunk_seconds)) and not closed
    final = float(streams.expected_final_size(total, first_s, last_s, now_s, end_s, cfg.chunk_seconds))
    return ChunkSnapshot(chunk, tuple(sides), N, n, h, thresholds, sum(sd.pending for sd in sides), closed,
                         tuple(cfg.metrics.split(",")), flowing, final)


@dataclass(frozen=True)
class ChunkPlan:
    """One step's plan for a chunk (`plan_chunk`)."""

    streak: int  # the T-round streak after this step
    evaluated: bool  # a round completed with new labels and was evaluated now (record `streak`)
    halfwidth: float  # the reported half-width the stopping rule reads (`ChunkReport.halfwidth`)
    tau: np.ndarray  # per stratum, the threshold paced to (`streams.plan_requests`)
    want: np.ndarray  # per stratum, the labels a round wants beyond the threshold's

    def status(self, snapshot: ChunkSnapshot, cfg, due: int, left: int, budget: int) -> str:
        """The chunk's status once `due` items are due under the planned thresholds, `left`
        items lie above them and the hourly budget allows `budget` more requests."""
        complete = snapshot.pending == 0 and not due  # the threshold sample is all labelled
        return str(chunk_status(self.streak, self.halfwidth, cfg.delta, cfg.stop_rounds, snapshot.closed,
                                left == 0 and complete, due > budget, complete))


def plan_chunk(snapshot: ChunkSnapshot, report: ChunkReport, prior: np.ndarray, cfg) -> ChunkPlan:
    """The stream design of `stats.streams` for one chunk: evaluate a completed round once, then
    pace the thresholds while items arrive or top the sample up by an online OPT round.  `report`:
    the chunk's report of the sampled sides' strata (its widest interval sizes and stops the rounds,
    its variance ratio and allocation scale where the difference estimator is active); `prior`: per
    stratum the mean calibrated score (the allocation's prior before labels arrive)."""
    s = snapshot
    lead = s.lead.cs
    halfwidth = report.halfwidth
    labels = int(s.n.sum())
    evaluated = s.pending == 0 and labels > lead.evaluated_round
    streak = int(stopping.next_streak(lead.streak, halfwidth, cfg.delta)) if evaluated else lead.streak
    converged = bool(np.isfinite(halfwidth) and halfwidth <= cfg.delta and streak >= cfg.stop_rounds)
    n_plan, h_plan = held_as_known(list(s.sides), s.N, s.n, s.h, prior)
    if n_plan is not s.n:  # no round past what the sampled side needs at the held side's prior
        converged = float(streams.chunk_interval(s.N, n_plan, h_plan, cfg.confidence, s.closed, s.target).halfwidth
                          ) <= cfg.delta
    total = float(s.N.sum())
    tau, want = streams.plan_requests(s.N, n_plan, h_plan, prior, s.thresholds, s.N * s.final_size / total, s.flowing,
                                      s.pending == 0, converged, cfg.delta, cfg.confidence,
                                      allocation.round_size(s.N.size, cfg.round_labels_per_stratum),
                                      closed=s.closed, target=s.target, variance_ratio=report.variance_ratio,
                                      spread_scale=report.allocation_scale, capacity=s.capacity)
    return ChunkPlan(streak, evaluated, halfwidth, tau, want)


def held_as_known(sides: list[Side], N: np.ndarray, n: np.ndarray, h: np.ndarray, q: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """The labels the design plans with: a held side's stratum counts as labelled whole, its
    positives its prior's (score-based pseudo-observations, as `opt_track` uses before labels
    arrive), so the rounds go to the strata that can be sampled (a round would otherwise go to
    the held stratum, the one without a label, and never be issued) and allocate for the metrics
    at the positives' expected share; the rounds end once that plan's interval is within delta
    (the sampled side has what it needs).  Only the plan: the reported interval stays undefined."""
    held = np.concatenate([np.full(sd.strata, sd.held) for sd in sides])
    if not held.any():
        return n, h
    return np.where(held, N, n), np.where(held, q * N, h)
