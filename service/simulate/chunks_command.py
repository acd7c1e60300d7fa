"""`stratameter simulate --stream --chunks C [--drop-at-chunk K --drop-by D]`: consecutive chunks read
as the service reads them (`chunks_study`), printed as a table or JSON; the running figures on
stderr after every tenth of the blocks (what a long study has shown so far)."""

from __future__ import annotations

import json
import math
import sys
import time

from . import stream_command
from .chunk_summary import COVERAGE_BAR, AlertSummary, SeriesSummary
from .chunks_study import ChunksStudy, ChunksSummary, as_json, run_study
from .trace import Share


def main(args, pop) -> int:
    """The study of `pop` with the checked `args` (`options.check_chunks`); 2 on a drop the
    population's precision cannot take."""
    if args.drop_by is not None and args.drop_by >= pop.truth:
        print(f"stratameter simulate: error: --drop-by {args.drop_by} needs a population precision above it; "
              f"{pop.name} has {pop.truth:.3f}", file=sys.stderr)
        return 2
    study = ChunksStudy(pop, args.scenario[0], stream_command.settings_from(args), args.runs, args.chunks,
                        args.drop_at_chunk, args.drop_by or 0.0, args.seed)
    t0 = time.monotonic()

    def progress(summary: ChunksSummary, blocks: int) -> None:
        w, c = summary.window, summary.last_closed
        print(f"chunks study: {summary.runs}/{study.runs} runs, {time.monotonic() - t0:.0f} s, "
              f"{summary.cpu_seconds:.0f} CPU s; coverage window {_pm(w.coverage, '.4f')}, "
              f"last closed {_pm(c.coverage, '.4f')}", file=sys.stderr, flush=True)

    summary = run_study(study, args.workers, progress)
    if args.json:
        print(json.dumps(as_json(study, summary)))
    else:
        _print(study, summary)
    return 0


def _print(study: ChunksStudy, r: ChunksSummary) -> None:
    s = study.settings
    drop = "no drop" if study.drop_at is None else f"precision -{study.drop_by:g} from chunk {study.drop_at}"
    print(f"{study.population.name} (precision {study.population.truth:.4f}): {study.chunks} chunks of "
          f"{s.chunk_seconds:g} s at {s.rate:g} items/s ({study.scenario}), {drop}; delta={s.delta}, "
          f"confidence={s.confidence:g}; {r.runs} runs, {r.cpu_seconds:.0f} CPU s; read every {study.every:g} s "
          f"after each series first shows an interval")
    print(f"{'series':<12} {'readings':>9} {'coverage pooled':>17} {'min at a time (h)':>19} "
          f"{f'times < {COVERAGE_BAR}':>14} {'bias':>19} {'half-width':>10}")
    for name, x in ((f"window {study.window_chunks}", r.window), ("last closed", r.last_closed)):
        print(_series_row(name, x))
    ratio = "-" if r.halfwidth_ratio is None else f"{r.halfwidth_ratio:.3f}"
    print(f"half-width of the window over the last closed chunk's (window full): {ratio}")
    print("alert: upper bound < SLO for 15 min (window: the default; chunk: the reported chunk's)")
    print(f"{'alert':<7} {'SLO':>14} {'fired':>6} {'hours to fire: mean':>20} {'p10':>6} {'median':>6} "
          f"{'p90':>6} {'false alarms/day':>17} {'(count / days)':>16} {'full window: /day':>18} {'(count / days)':>16}")
    for a in r.alerts:
        print(_alert_row(a))


def _series_row(name: str, x: SeriesSummary) -> str:
    worst = "-" if x.min_coverage is None else f"{x.min_coverage:.3f} ({x.min_at_hours:.2f})"
    hw = "-" if x.halfwidth is None else f"{x.halfwidth:.4f}"
    return (f"{name:<12} {x.readings:>9} {_pm(x.coverage, '.4f'):>17} {worst:>19} "
            f"{f'{x.times_below}/{x.times}':>14} {_pm(x.bias, '+.5f'):>19} {hw:>10}")


def _alert_row(a: AlertSummary) -> str:
    slo = f"{a.slo:.4f} (p-{a.slo_offset:g})"
    cells = [_num(a.fired, ".3f")] + [_num(v, ".2f") for v in (a.hours_mean, a.hours_p10, a.hours_median, a.hours_p90)]
    return (f"{a.alert:<7} {slo:>14} {cells[0]:>6} {cells[1]:>20} {cells[2]:>6} {cells[3]:>6} {cells[4]:>6} "
            f"{_pm(a.false_alarms_per_day, '.3f'):>17} {f'{a.false_alarms} / {a.days:.0f}':>16} "
            f"{_pm(a.full_window_false_alarms_per_day, '.3f'):>18} "
            f"{f'{a.full_window_false_alarms} / {a.full_window_days:.0f}':>16}")


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{v:{fmt}}"


def _pm(x: Share, fmt: str) -> str:
    if x.mean is None:
        return "-"
    return f"{x.mean:{fmt}} +- {x.se:.4f}" if x.se is not None else f"{x.mean:{fmt}}"
