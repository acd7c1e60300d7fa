"""`stratameter simulate --stream`: the service's stream design over a population (`stream_study`),
with its progress, table and JSON; `--metric` and `--calibration` as the study takes them."""

from __future__ import annotations

import json
import sys

from . import stream_study
from .arrivals import SCENARIOS, StreamSettings


def settings_from(args, metric: str = "precision") -> StreamSettings:
    """The stream settings the checked `args` (`options.check_stream`) ask for, defaults elsewhere."""
    defaults = StreamSettings()
    return StreamSettings(
        delta=args.delta, confidence=args.confidence if args.confidence is not None else 1.0 - args.alpha,
        chunk_seconds=args.chunk_seconds or defaults.chunk_seconds, rate=args.rate or defaults.rate,
        lateness=defaults.lateness if args.lateness is None else args.lateness,
        max_labels_per_hour=args.max_labels_per_hour, review_delay=args.review_delay, skip_rate=args.skip_rate,
        strata=args.strata, metric=metric, negative_strata=args.negative_strata,
    )


def main(args, pop) -> int:
    """The stream study of `pop` with the checked `args` (`options.check_stream`); 2 on a scenario the
    population cannot run."""
    metric = getattr(args, "metric", "precision")
    settings = settings_from(args, metric)
    study = stream_study.StreamStudy(pop, args.scenario, settings, args.runs, args.seed)
    try:
        for name in study.scenarios:  # fail fast on what a scenario cannot do with this population
            if SCENARIOS[name].drift and metric != "precision":
                raise ValueError(f"--scenario {name} lowers precision: it applies to --metric precision only")
            if SCENARIOS[name].drift >= stream_study.population_truth(pop, metric):
                raise ValueError(f"--scenario {name}: a precision drop of {SCENARIOS[name].drift} needs a "
                                 f"population precision above it; {pop.name} has {pop.truth:.3f}")
    except ValueError as exc:
        print(f"stratameter simulate: error: {exc}", file=sys.stderr)
        return 2
    if args.calibration:
        return _calibration(args, study)
    if args.json or not sys.stderr.isatty():
        static, rows = stream_study.run_study(study, workers=args.workers)
    else:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(TextColumn("simulating {task.description}"), BarColumn(),
                      TextColumn("{task.completed}/{task.total} (static design and scenarios)"),
                      TimeElapsedColumn(), transient=True) as bar:
            task = bar.add_task(pop.name, total=len(study.scenarios) + 1)
            static, rows = stream_study.run_study(study, lambda done, total: bar.update(task, completed=done), args.workers)
    if args.json:
        print(json.dumps(stream_study.as_json(study, static, rows)))
    else:
        _print_table(study, static, rows)
    return 0


def _calibration(args, study: stream_study.StreamStudy) -> int:
    cells = stream_study.run_calibration_study(study, workers=args.workers)
    if args.json:
        print(json.dumps(stream_study.calibration_json(study, cells)))
        return 0
    s, pop = study.settings, study.population
    print(f"{pop.name} (precision {pop.truth:.4f}) as a stream: {s.chunk_seconds:g} s chunks, {s.rate:g} items/s, "
          f"delta={s.delta}, confidence={s.confidence:g}, {study.runs} paired runs per scenario "
          f"(today's estimator / with the calibration)")
    print(f"{'scenario':<13} {'labels today':>12} {'with calibration':>17} {'saving':>15} "
          f"{'coverage':>13} {'reached delta':>13} {'active at stop':>15}")
    for name, c in cells:
        print(f"{name:<13} {c.labels_plain:>12.1f} {c.labels_calibrated:>17.1f} "
              f"{100 * c.saving:>+8.1f} ± {100 * c.saving_stderr:.1f} % {c.coverage_plain:>6.3f}/{c.coverage_calibrated:.3f} "
              f"{c.reached_plain:>6.3f}/{c.reached_calibrated:.3f} {100 * c.active_at_stop:>14.0f}%")
    return 0


def _print_table(study: stream_study.StreamStudy, static, rows) -> None:
    from rich.console import Console
    from rich.table import Table

    s, pop = study.settings, study.population
    budget = "no budget" if s.max_labels_per_hour is None else f"{s.max_labels_per_hour} labels/hour"
    title = (f"{pop.name} ({s.metric} {stream_study.population_truth(pop, s.metric):.4f}) as a stream: "
             f"{s.chunk_seconds:g} s chunks, {s.rate:g} items/s, "
             f"lateness {s.lateness:g} s, {budget}; delta={s.delta}, alpha={1 - s.confidence:.2g}, "
             f"runs={study.runs}; static design: {static.labels_mean:.0f} +- {static.labels_se:.0f} labels")
    t = Table(title=title)
    cols = ("scenario", "items", "labels +- se", "reached delta", "InConf (reached)", "cover (closed)",
            "vs static", "capped", "stop (min)")
    for col in cols:
        t.add_column(col, justify="left" if col == "scenario" else "right", no_wrap=True)
    for r in rows:
        inconf = "-" if r.in_conf_reached is None else f"{r.in_conf_reached:.3f}"
        ratio = "-" if r.ratio_vs_static is None else f"{r.ratio_vs_static:.3f}"
        t.add_row(r.scenario, f"{r.items_mean:.0f}", f"{r.labels_mean:.0f} +- {r.labels_se:.0f}",
                  f"{r.reached_delta:.3f}", inconf, f"{r.coverage_closed:.3f}", ratio, f"{r.capped:.3f}",
                  f"{r.stop_minutes_mean:.0f}")
    console = Console()
    if not console.is_terminal:
        console = Console(width=140)
    console.print(t)
