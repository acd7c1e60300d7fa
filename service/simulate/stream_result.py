"""What `simulate --stream` returns of its runs (`stream.run_stream`, summarised by
`stream_study`): per run, its chunk at its stop (labels, requests, the reported interval, how it
stopped, the truth), filled in as the runs stop, and what the options keep beside (a per-step
trace of the first runs, the items and their requests, the gauge's readings)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .arrivals import Chunks
from .trace import GaugeTrace


@dataclass
class StreamResult:
    """Per run, at stop."""

    labels: np.ndarray  # answered labels
    requests: np.ndarray  # requests issued (answered, skipped, expired or pending)
    estimate: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    halfwidth: np.ndarray
    converged: np.ndarray  # bool
    closed: np.ndarray  # bool (every run stops closed)
    status: np.ndarray  # str, `chunks.lifecycle.chunk_status` at stop
    capped: np.ndarray  # bool: stopped by the time cap
    stop_seconds: np.ndarray
    truth: np.ndarray
    items: np.ndarray  # chunk size
    reservoir_overflow: np.ndarray  # bool: a stratum's threshold sample exceeded RESERVOIR_SIZE
    budget_blocked_steps: np.ndarray  # steps in which requests waited for the budget
    tau: np.ndarray | None = None  # (runs, K) thresholds at stop
    n: np.ndarray | None = None  # (runs, K) labels at stop
    h: np.ndarray | None = None  # (runs, K) positive labels at stop
    N: np.ndarray | None = None  # (runs, K) final stratum sizes
    trace: list = field(default_factory=list)  # per step, for the traced runs
    chunks: Chunks | None = None  # with keep_items
    requested: np.ndarray | None = None  # with keep_items: per layout item
    requested_at: np.ndarray | None = None
    calibrated: np.ndarray | None = None  # bool: the difference estimator's interval was reported at stop
    gauge: GaugeTrace | None = None  # with gauge_seconds: the gauge's readings (`trace`)

    @classmethod
    def start(cls, c: Chunks, overflow: np.ndarray, blocked_steps: np.ndarray) -> "StreamResult":
        """Before any run stops: the chunks' truth and size, the arrays the loop keeps counting in
        (`overflow`, `blocked_steps`), and the rest zero or NaN until the runs' `stopped`."""
        R, K = c.runs, c.K
        return cls(*(np.zeros(R, dtype=np.int64) for _ in range(2)), *(np.full(R, np.nan) for _ in range(4)),
                   np.zeros(R, bool), np.zeros(R, bool), np.full(R, "open", dtype=object), np.zeros(R, bool),
                   np.full(R, np.nan), c.truth, c.count, overflow, blocked_steps, np.zeros((R, K)),
                   np.zeros((R, K), dtype=np.int64), np.zeros((R, K), dtype=np.int64), np.zeros((R, K)),
                   calibrated=np.zeros(R, dtype=bool))

    def stopped(self, runs: np.ndarray, **at_stop) -> None:
        """The `runs` that stop now: each field named in `at_stop` takes its values over `runs` (or
        one value for them all)."""
        for name, values in at_stop.items():
            getattr(self, name)[runs] = values
