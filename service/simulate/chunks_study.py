"""`stratameter simulate --stream --chunks C` as a study: runs of C consecutive chunks (a precision
drop from one of them on), read every `trace.SCRAPE_SECONDS` as the service reads them
(`chunk_states`, `chunk_readings`), summarised by `chunk_summary`.

The runs go in blocks (`block_runs`: about `stream_study.TRACE_BLOCK_RUNS` chunks a block, each
block drawn from its own seed), so a block's runs depend only on the seed and the block, not on how
many processes run them.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np

from ..chunks.window import parse_duration
from .arrivals import SCENARIOS, StreamSettings
from .chunk_readings import Readings, Stream, read_block
from .chunk_states import draw_states
from .chunk_summary import (ALERT_FOR_SECONDS, ALERT_WINDOW, AlertSummary, SeriesSummary, halfwidth_ratio,
                            summarise_alert, summarise_series)
from .parallel import iter_in_processes
from .stream_study import TRACE_BLOCK_RUNS
from .trace import SCRAPE_SECONDS

#: The SLOs the alert is read at, as the classifier's precision before the drop minus the SLO.
SLO_OFFSETS = (0.01, 0.0)


@dataclass(frozen=True)
class ChunksStudy:
    population: object
    scenario: str
    settings: StreamSettings
    runs: int
    chunks: int
    drop_at: int | None
    drop_by: float
    seed: int
    every: float = SCRAPE_SECONDS

    @property
    def window_chunks(self) -> int:
        """The chunks of the alert's window (`ALERT_WINDOW`, the service's default window)."""
        return max(1, parse_duration(ALERT_WINDOW) // int(self.settings.chunk_seconds))

    @property
    def drop_seconds(self) -> float | None:
        return None if self.drop_at is None else self.drop_at * self.settings.chunk_seconds

    def block_runs(self) -> list[int]:
        """The runs of each block: about `TRACE_BLOCK_RUNS` chunks a block."""
        size = max(1, min(self.runs, TRACE_BLOCK_RUNS // self.chunks))
        return [min(size, self.runs - lo) for lo in range(0, self.runs, size)]


def run_block(task) -> tuple[Readings, float]:
    """One block's readings and the CPU seconds they took."""
    study, block, runs = task
    t0 = time.process_time()
    s = study.settings
    rng = np.random.default_rng(np.random.SeedSequence([study.seed, 49, block]))
    states = draw_states(study.population, SCENARIOS[study.scenario], s, runs, study.chunks, study.drop_at,
                         study.drop_by, study.every, rng)
    stream = Stream(states, runs, study.chunks, int(round(s.chunk_seconds / study.every)), study.window_chunks,
                    s.lateness / study.every)
    return read_block(stream, s.confidence), time.process_time() - t0


@dataclass
class ChunksSummary:
    runs: int
    cpu_seconds: float
    window: SeriesSummary
    last_closed: SeriesSummary
    halfwidth_ratio: float | None
    alerts: list[AlertSummary] = field(default_factory=list)


def summarise(study: ChunksStudy, r: Readings, cpu_seconds: float) -> ChunksSummary:
    """The study's figures from the readings of its runs so far (`chunk_summary`)."""
    seconds = r.seconds
    before = study.population.truth
    alerts = []
    for offset in SLO_OFFSETS:
        for name, upper in (("window", r.window.upper), ("chunk", r.reported_upper)):
            alerts.append(summarise_alert(name, upper, r.window.shown, r.window_chunks == study.window_chunks,
                                          seconds, before - offset, offset, study.every, study.drop_seconds))
    return ChunksSummary(r.window.lower.shape[0], cpu_seconds, summarise_series(r.window, seconds),
                         summarise_series(r.last_closed, seconds),
                         halfwidth_ratio(r.window, r.last_closed, r.window_chunks, study.window_chunks), alerts)


def run_study(study: ChunksStudy, workers: int | None = None,
              progress: Callable[[ChunksSummary, int], None] | None = None) -> ChunksSummary:
    """Every block (in processes), `progress(summary so far, blocks)` after every tenth of them; the
    summary of all."""
    tasks = [(study, b, runs) for b, runs in enumerate(study.block_runs())]
    tenth = max(1, len(tasks) // 10)
    done: list[Readings] = []
    cpu = 0.0
    summary = None
    for readings, seconds in iter_in_processes(run_block, tasks, workers):
        done.append(readings)
        cpu += seconds
        if len(done) == len(tasks) or (progress is not None and len(done) % tenth == 0):
            summary = summarise(study, Readings.concat(done), cpu)
            if progress is not None:
                progress(summary, len(tasks))
    return summary


def as_json(study: ChunksStudy, summary: ChunksSummary) -> dict:
    """The document of `stratameter simulate --stream --chunks C --json`."""
    s = study.settings
    return {"mode": "stream-chunks", "population": study.population.name, "truth": study.population.truth,
            "scenario": study.scenario, "chunks": study.chunks, "drop_at_chunk": study.drop_at,
            "drop_by": study.drop_by, "runs": study.runs, "seed": study.seed, "scrape_seconds": study.every,
            "window": ALERT_WINDOW, "window_chunks": study.window_chunks, "alert_for_seconds": ALERT_FOR_SECONDS,
            "settings": asdict(s), **asdict(summary)}
