"""`stratameter simulate --stream` as a study: every scenario of a population,
the static design beside it, summaries and the JSON document; the gauge trace's
bias and coverage (`--trace`, `run_trace_study`)."""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, replace
from typing import Callable

import numpy as np

from ..stats.difference import CALIBRATION_MIN_LABELS
from . import engine, whole
from .arrivals import SCENARIOS, StreamSettings, concat, draw
from .calibrated import BLOCK_RUNS, Cell, Stop
from .parallel import map_in_processes
from .populations import Population
from .stream import run_chunks, run_stream
from .stream_result import StreamResult
from .trace import SCRAPE_SECONDS, GaugeTrace, TraceSummary
from .trace import summarise as summarise_trace
from .whole_populations import WholeStream


@dataclass
class StreamSummary:
    scenario: str
    description: str
    runs: int
    labels_mean: float
    labels_se: float
    requests_mean: float
    reached_delta: float  # share of chunks converged at stop
    in_conf_reached: float | None  # |estimate - truth| <= delta among those
    coverage_closed: float  # every (closed) chunk's final interval vs its realised truth
    no_interval: float  # share of chunks with no interval at stop (counted as not covering)
    capped: float
    exhausted: float
    reservoir_overflow: float
    budget_blocked: float  # share of chunks that ever waited for the budget
    truth_mean: float
    items_mean: float
    stop_minutes_mean: float
    static_labels: float | None = None
    ratio_vs_static: float | None = None
    seconds: float = 0.0


def summarise(name: str, r: StreamResult, delta: float, runs: int, seconds: float) -> StreamSummary:
    ok = np.isfinite(r.lower) & np.isfinite(r.upper)
    cover = ok & (r.lower <= r.truth) & (r.truth <= r.upper)
    conv = r.converged
    inconf = np.abs(r.estimate - r.truth) <= delta
    lab = r.labels.astype(float)
    return StreamSummary(
        scenario=name, description=SCENARIOS[name].description if name in SCENARIOS else "", runs=runs,
        labels_mean=float(lab.mean()), labels_se=float(lab.std(ddof=1) / math.sqrt(lab.size)) if lab.size > 1 else 0.0,
        requests_mean=float(r.requests.mean()), reached_delta=float(conv.mean()),
        in_conf_reached=float(inconf[conv].mean()) if conv.any() else None,
        coverage_closed=float(cover[r.closed].mean()) if r.closed.any() else math.nan,
        no_interval=float((~ok).mean()), capped=float(r.capped.mean()),
        exhausted=float(np.mean(r.status == "exhausted")), reservoir_overflow=float(r.reservoir_overflow.mean()),
        budget_blocked=float(np.mean(r.budget_blocked_steps > 0)), truth_mean=float(r.truth.mean()),
        items_mean=float(r.items.mean()), stop_minutes_mean=float(np.mean(r.stop_seconds) / 60.0), seconds=seconds,
    )


def run_cell(pop: Population, scenario: str, s: StreamSettings, runs: int, seed) -> StreamSummary:
    t0 = time.perf_counter()
    r = run_stream(pop, SCENARIOS[scenario], s, runs, seed)
    return summarise(scenario, r, s.delta, runs, time.perf_counter() - t0)


@dataclass
class StaticSummary:
    """The fixed-population design (`stratameter simulate` without --stream) on the same population."""

    method: str
    stratification: str
    labels_mean: float
    labels_se: float
    in_conf: float
    runs: int


def run_static(pop, delta: float, confidence: float, runs: int, seed, metric: str = "precision") -> StaticSummary:
    if metric != "precision":
        return _run_static_whole(pop, metric, delta, confidence, runs, seed)
    design = engine.Design()
    st = engine.prepare(pop, design)
    r = engine.run_until_stop(st, design, engine.Protocol(delta=delta, confidence=confidence), runs, seed)
    return StaticSummary(design.method, design.stratification, float(r.labels.mean()),
                         float(r.labels.std(ddof=1) / math.sqrt(runs)),
                         float(np.mean(np.abs(r.estimate - pop.truth) <= delta)), runs)


def _run_static_whole(pop: WholeStream, metric: str, delta: float, confidence: float, runs: int,
                      seed) -> StaticSummary:
    design = whole.WholeDesign()
    protocol = engine.Protocol(delta=delta, confidence=confidence)
    r = whole.run_whole_until_stop(whole.prepare_whole(pop, design, [metric]), design, [metric], protocol, runs,
                                   seed, whole.max_labels(pop, protocol))
    return StaticSummary(design.method, f"{design.stratification}+{design.negative_stratification}",
                         float(r.labels.mean()), float(r.labels.std(ddof=1) / math.sqrt(runs)),
                         float(np.mean(np.abs(r.estimate[metric] - pop.truth(metric)) <= delta)), runs)


def population_truth(pop, metric: str) -> float:
    """The population's value of the study's metric."""
    return pop.truth(metric) if isinstance(pop, WholeStream) else pop.truth


@dataclass
class StreamStudy:
    population: Population
    scenarios: list[str]
    settings: StreamSettings
    runs: int
    seed: int


def _task(args):
    index, study, what = args
    s = study.settings
    if what is None:
        return index, run_static(study.population, s.delta, s.confidence, study.runs,
                                 np.random.SeedSequence([study.seed, 1000]), s.metric)
    seed = np.random.SeedSequence([study.seed, list(SCENARIOS).index(what)])
    return index, run_cell(study.population, what, s, study.runs, seed)


def run_study(study: StreamStudy, progress: Callable[[int, int], None] | None = None,
              workers: int | None = None) -> tuple[StaticSummary, list[StreamSummary]]:
    """Every scenario, and the static design for comparison, in parallel processes.

    A scenario's runs depend only on the seed and the scenario (not on which
    other scenarios are run).
    """
    tasks = [(0, study, None)] + [(i + 1, study, name) for i, name in enumerate(study.scenarios)]
    results = [r for _, r in map_in_processes(_task, tasks, progress, workers)]
    static, rows = results[0], results[1:]
    for row in rows:
        row.static_labels = static.labels_mean
        row.ratio_vs_static = row.labels_mean / static.labels_mean if static.labels_mean > 0 else None
    return static, rows


def as_json(study: StreamStudy, static: StaticSummary, rows: list[StreamSummary]) -> dict:
    """The machine-readable document of `stratameter simulate --stream --json`."""
    s = study.settings
    settings = {k: v for k, v in asdict(s).items() if k not in ("delta", "confidence")}
    return {
        "mode": "stream",
        "population": study.population.name,
        "size": study.population.size,
        "metric": s.metric,
        "truth": population_truth(study.population, s.metric),
        "delta": s.delta,
        "alpha": round(1.0 - s.confidence, 10),
        "confidence": s.confidence,
        "runs": study.runs,
        "seed": study.seed,
        "settings": settings,
        "static": asdict(static),
        "scenarios": [{k: _json_number(v) for k, v in asdict(r).items()} for r in rows],
    }


def _json_number(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def run_calibration_study(study: StreamStudy, progress: Callable[[int, int], None] | None = None,
                          workers: int | None = None) -> list[tuple[str, Cell]]:
    """Every scenario with precision's difference estimator (``CALIBRATION_MIN_LABELS``
    `difference.CALIBRATION_MIN_LABELS`) beside today's estimator, on the same chunks (the
    same seed: `run_stream` draws the chunks before anything of the calibration), in blocks of
    `calibrated.BLOCK_RUNS` runs, each drawn from its own seed; each chunk judged by its own precision.
    The blocks of a scenario are stepped together, a share of them per process (`_calibration_blocks`:
    each block's runs as if run alone, so the results do not depend on the processes)."""
    blocks = -(-study.runs // BLOCK_RUNS)
    parts = np.array_split(np.arange(blocks), min(blocks, workers or os.cpu_count() or 1))
    tasks = [(study, name, [(np.random.SeedSequence([study.seed, list(SCENARIOS).index(name), int(b)]),
                             min(BLOCK_RUNS, study.runs - int(b) * BLOCK_RUNS)) for b in part])
             for name in study.scenarios for part in parts]
    done = map_in_processes(_calibration_blocks, tasks, progress, workers)
    cells = []
    for i, name in enumerate(study.scenarios):
        mine = [block for part in done[i * len(parts):(i + 1) * len(parts)] for block in part]
        pairs = [pair for block, _ in mine for pair in block]
        truth = np.concatenate([t for _, t in mine])
        cells.append((name, Cell.of(study.population.name, study.settings.delta, pairs, truth)))
    return cells


def _calibration_blocks(task) -> list[tuple[list[tuple[Stop, Stop]], np.ndarray]]:
    """Blocks of one scenario, each (seed, runs) drawn as `run_stream` draws it, run today's way and
    with the calibration in one `run_chunks` (a group per block and way): per block its (today's stop,
    the calibrated stop) pairs and its chunks' truth."""
    study, name, blocks = task
    s = replace(study.settings, calibration_min_labels=CALIBRATION_MIN_LABELS)
    chunks, folds = [], []
    for seed, runs in blocks:
        rng = np.random.default_rng(seed)
        chunks.append(draw(study.population, SCENARIOS[name], s, runs, rng))
        folds.append(rng.integers(0, 2, chunks[-1].key.size, dtype=np.int8) if chunks[-1].target is None else None)
    merged, fold = concat(chunks + chunks, None if folds[0] is None else [np.zeros_like(f) for f in folds] + folds)
    sizes = [c.runs for c in chunks + chunks]
    groups = np.repeat(np.arange(len(sizes)), sizes)
    r = run_chunks(merged, s, fold, calibrated=groups >= len(chunks), groups=groups)
    runs = np.split(np.arange(groups.size), np.cumsum(sizes)[:-1])  # per group, its runs
    return [(list(zip(_stops(r, runs[b]), _stops(r, runs[len(chunks) + b]))), r.truth[runs[b]])
            for b in range(len(chunks))]


def _stops(r: StreamResult, runs: np.ndarray) -> list[Stop]:
    covered = np.isfinite(r.lower) & (r.lower <= r.truth) & (r.truth <= r.upper)
    return [Stop(int(r.labels[i]), float(r.estimate[i]), bool(covered[i]), bool(r.calibrated[i]),
                 bool(r.converged[i])) for i in runs]


def calibration_json(study: StreamStudy, cells: list[tuple[str, Cell]]) -> dict:
    """The document of `stratameter simulate --stream --calibration --json`."""
    s = study.settings
    return {
        "mode": "stream-calibration", "population": study.population.name, "truth": study.population.truth,
        "delta": s.delta, "confidence": s.confidence, "runs": study.runs, "seed": study.seed,
        "calibration_min_labels": CALIBRATION_MIN_LABELS,
        "settings": {k: v for k, v in asdict(s).items() if k not in ("delta", "confidence", "calibration_min_labels")},
        "scenarios": [{"scenario": name, **{k: _json_number(v) for k, v in asdict(c).items()}} for name, c in cells],
    }


#: Runs per process task of the gauge trace (`run_trace_study`): the loop is vectorised over runs,
#: a block this large spends little on its per-step overhead.
TRACE_BLOCK_RUNS = 500


def run_trace_study(study: StreamStudy, every: float = SCRAPE_SECONDS,
                    progress: Callable[[int, int], None] | None = None,
                    workers: int | None = None) -> list[tuple[str, TraceSummary, float]]:
    """Every scenario's gauge trace (`run_stream` with ``gauge_seconds=every``, `trace`), in blocks of
    `TRACE_BLOCK_RUNS` runs spread over processes: per scenario its `trace.summarise` and the CPU
    seconds its blocks took.  A block's runs depend only on the seed, the scenario and the block."""
    blocks = -(-study.runs // TRACE_BLOCK_RUNS)
    tasks = [(study, name, every, np.random.SeedSequence([study.seed, list(SCENARIOS).index(name), b]),
              min(TRACE_BLOCK_RUNS, study.runs - b * TRACE_BLOCK_RUNS))
             for name in study.scenarios for b in range(blocks)]
    done = map_in_processes(_trace_block, tasks, progress, workers)
    out = []
    for i, name in enumerate(study.scenarios):
        mine = done[i * blocks:(i + 1) * blocks]
        out.append((name, summarise_trace(GaugeTrace.concat([g for g, _ in mine])), sum(t for _, t in mine)))
    return out


def _trace_block(task) -> tuple[GaugeTrace, float]:
    study, name, every, seed, runs = task
    t0 = time.process_time()
    r = run_stream(study.population, SCENARIOS[name], study.settings, runs, seed, gauge_seconds=every)
    return r.gauge, time.process_time() - t0


def trace_json(study: StreamStudy, every: float, cells: list[tuple[str, TraceSummary, float]]) -> dict:
    """The document of `stratameter simulate --stream --trace --json`."""
    s = study.settings
    return {
        "mode": "stream-trace", "population": study.population.name, "truth": study.population.truth,
        "delta": s.delta, "confidence": s.confidence, "runs": study.runs, "seed": study.seed, "scrape_seconds": every,
        "settings": {k: v for k, v in asdict(s).items() if k not in ("delta", "confidence")},
        "scenarios": [{"scenario": name, **_trace_doc(summary), "cpu_seconds": round(seconds, 3)}
                      for name, summary, seconds in cells],
    }


def _trace_doc(t: TraceSummary) -> dict:
    share = lambda x: {k: _json_number(v) for k, v in asdict(x).items()}  # noqa: E731
    return {"readings": t.readings, "no_interval": t.no_interval, "bias": share(t.bias), "coverage": share(t.coverage),
            "minutes": {str(m): {"bias": share(v["bias"]), "coverage": share(v["coverage"]),
                                 "no_interval": v["no_interval"]} for m, v in t.at_minute.items()}}
